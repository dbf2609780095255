"""``benchmarks/gpu_quality.py``: issue 14's GPU rows (image mode, ncdlr against UNO, seed by seed).

The smoke run is a fake of the GPU measurement only in that it runs on the CPU at tiny sizes (CI has no GPU): the
runs are the service's real ones (Ray Train, Ray Data from prepared JPEG shards, the buffer actor, the evaluation),
built from the command line a user types; the numbers mean nothing, the keys and the pairing do.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_quality  # noqa: E402


def test_uno_is_the_config_with_the_method_alone_changed(tmp_path: Path) -> None:
    common = dict(epochs=10, batch_size=64, use_gpu=True, cpus_per_worker=4.0, extra=[])
    ncdlr = gpu_quality.run_arguments("c.yaml", "d", "ncdlr", 2, output=tmp_path / "a", **common)
    uno = gpu_quality.run_arguments("c.yaml", "d", "uno", 2, output=tmp_path / "a", **common)
    assert uno == ncdlr + ["--method.name", "uno"]
    pairs = dict(zip(ncdlr[::2], ncdlr[1::2]))
    assert pairs["--run.seed"] == pairs["--model.prototype_seed"] == "2" and pairs["--run.num_workers"] == "1"
    with pytest.raises(ValueError, match="method must be one of"):
        gpu_quality.run_arguments("c.yaml", "d", "autonovel", 0, output=tmp_path, **common)


def test_the_paired_gap_uses_only_seeds_both_methods_finished() -> None:
    rows = [{"method": "ncdlr", "seed": s, "novel": v} for s, v in enumerate([30.0, 34.0, 29.0])]
    rows += [{"method": "uno", "seed": s, "novel": v} for s, v in enumerate([25.0, 27.0])]  # seed 2 cut by the budget
    gap = gpu_quality.paired_gap(rows)
    assert gap == {"key": "novel", "gap": 6.0, "se": 1.0, "seeds": 2}  # differences 5 and 7: SE = std(ddof 1)/√2
    assert gpu_quality.paired_gap(rows[:1] + rows[3:4]) is None  # one pair has no SE


def test_summarize_merges_several_processes_rows_in_seed_order(tmp_path: Path) -> None:
    """One file per concurrent process (``--jsonl``); a process killed mid-line leaves a partial last line."""
    row = {"epochs": 10, "device": "d", "novel_head": 1.0, "novel_medium": 2.0, "novel_tail": 3.0,
           "steps_per_s": 1.0, "data_share": 0.5, "seconds": 60.0}
    seed1 = [{**row, "method": m, "seed": 1, "novel": n, "known": 60.0, "all": 50.0} for m, n in [("uno", 22.0),
                                                                                                ("ncdlr", 30.0)]]
    (tmp_path / "s1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in seed1))
    (tmp_path / "s0.jsonl").write_text(json.dumps({**row, "method": "ncdlr", "seed": 0, "novel": 28.0, "known": 61.0,
                                                   "all": 51.0}) + "\n" + '{"method": "uno", "se')
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_quality.py"), "--summarize",
                          str(tmp_path / "s1.jsonl"), str(tmp_path / "s0.jsonl"), "--out", str(tmp_path / "out")],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    merged = [json.loads(line) for line in (tmp_path / "out" / "gpu_quality.jsonl").read_text().splitlines()]
    assert [(r["method"], r["seed"]) for r in merged] == [("ncdlr", 0), ("ncdlr", 1), ("uno", 1)]
    assert "| ncdlr | [0, 1] | 29.0 ± 1.0 |" in out.stdout and "| uno | [1] | 22.0 ± 0.0 |" in out.stdout
    assert "paired seeds" not in out.stdout  # one pair has no SE
    assert "skipped a partial line" in out.stderr
    empty = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_quality.py"), "--summarize",
                            str(tmp_path / "none.jsonl")], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert empty.returncode == 1 and "the file is missing" in empty.stderr and "no rows" in empty.stderr


def test_no_gpu_without_smoke_is_refused() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_quality.py"), "--data", "x"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 2 and "no CUDA device" in out.stderr


@pytest.mark.slow
def test_the_smoke_run_trains_uno_from_the_config_and_prints_its_row(tmp_path: Path) -> None:
    """UNO alone (``--methods uno``): the config's ncdlr options reset as published is the part a GPU call must not
    get wrong, and each Ray Train run costs ≈ 20 s of worker-group start here; the pairing is tested above."""
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_quality.py"), "--smoke", "--seeds", "1",
                          "--seed-start", "3", "--object-store-gb", "1", "--jsonl", str(tmp_path / "s3.jsonl"),
                          "--methods", "uno"],
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert [(r["method"], r["seed"]) for r in lines] == [("uno", 3)]
    assert [json.loads(line) for line in (tmp_path / "s3.jsonl").read_text().splitlines()] == lines
    for r in lines:
        assert r["smoke"] is True and r["device"] == "cpu" and r["epochs"] == 1
        assert all(0.0 <= r[k] <= 100.0 for k in gpu_quality.RESULT_KEYS)
        assert r["steps_per_s"] > 0 and 0.0 <= r["data_share"] <= 1.0 and r["seconds"] > 0
    assert "| uno | [3] |" in out.stdout and "| ncdlr |" not in out.stdout
    assert "trains with method.task_weight=0.0" in out.stderr  # UNO as published on the config (file_resets)


def test_without_a_gpu_full_size_runs_need_cpu_and_data(capsys) -> None:
    """No CUDA here: a full-size call says that ``--cpu`` runs it on the CPU; ``--cpu`` still needs ``--data``."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the call would train")
    with pytest.raises(SystemExit) as refused:
        gpu_quality.main(["--data", "nowhere"])
    assert refused.value.code == 2 and "pass --cpu" in capsys.readouterr().err
    with pytest.raises(SystemExit) as no_data:
        gpu_quality.main(["--cpu"])
    assert no_data.value.code == 2 and "--data is required" in capsys.readouterr().err
