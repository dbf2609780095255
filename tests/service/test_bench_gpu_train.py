"""``benchmarks/bench_gpu_train.py --smoke``: the GPU throughput benchmark's wiring, run on CPU at tiny sizes.

A fake of the GPU measurement only in that it runs on the CPU (CI has no GPU): the Ray Train run, Ray Data from
local shards and the in-memory ceiling are the real ones; the numbers are not meaningful, the keys are.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_smoke_run_prints_one_json_line_per_input_design_with_every_figure():
    """One design, hybrid (the host design's stream is every image-mode service test's), streaming its two epochs
    from one Ray Data execution (``--epochs-per-execution 2``; 1, the service's default, is what every other
    service test runs): each Ray Train run costs ≈ 20 s of worker-group start here, so one run, not one per design."""
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_gpu_train.py"), "--smoke",
                          "--decode-on", "hybrid", "--feed", "--epochs-per-execution", "2"],
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [json.loads(line) for line in out.stdout.strip().splitlines() if line.startswith("{")]
    assert [(line["decode_on"], line["epochs_per_execution"]) for line in lines] == [("hybrid", 2)]
    for line in lines:
        assert line["smoke"] is True and line["mfu"] is None  # no GPU: no peak, no MFU
        assert line["images_per_s"] > 0 and line["ceiling_images_per_s"] > 0
        rounding = 0.05 / line["images_per_s"] + 0.05 / line["ceiling_images_per_s"]  # both printed to 0.1
        assert line["ratio"] == pytest.approx(line["images_per_s"] / line["ceiling_images_per_s"], rel=rounding, abs=1e-3)
        assert 0.0 <= line["data_share"] <= 1.0
        assert line["feed_images_per_s"] > 0
        assert line["epoch1_s"] > 0 and line["first_batch_s"] >= 0 and line["first_step_s"] >= 0
        assert line["later_epoch_s"] > 0  # epoch 2 came out of the same execution, cut at steps_per_epoch


@pytest.mark.parametrize("value", ["0", "2,x"])
def test_a_bad_epochs_per_execution_list_is_refused(value: str):
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_gpu_train.py"), "--smoke",
                          "--epochs-per-execution", value], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 2 and "--epochs-per-execution takes positive integers" in out.stderr
