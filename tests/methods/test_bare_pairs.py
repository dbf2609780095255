"""benchmarks/bare_pairs.py: the bare cache command's arms over paired seeds, run and read.

The reading is checked on hand-written ``metrics.json`` files (the keys a real run writes); the run loop is checked
on what it must not do (train again a finished run) and on a real ``ncdlr train`` subprocess that fails at once on a
flag it does not know (no Ray start): a full training run is every service test's and costs a minute here.
"""

from __future__ import annotations

import json
import math
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

from tests.fixtures.benchmarks import load_benchmark

bare = load_benchmark("bare_pairs")

BARE, UNO = bare.Arm("bare", ()), bare.Arm("uno", ("--method.name", "uno"))


def write_run(out: Path, arm: str, seed: int, novel: float, known: float) -> None:
    folder = out / f"{arm}-s{seed}"
    folder.mkdir(parents=True)
    groups = {f"novel_{g}": novel + d for g, d in zip(bare.GROUPS, (0.001, 0.0, -0.001))}
    (folder / "metrics.json").write_text(json.dumps({"novel": novel, "known": known, **groups}))


def test_an_arm_is_a_name_and_the_flags_it_adds():
    assert bare.parse_arm("uno=--method.name uno") == UNO
    assert bare.parse_arm("bare=") == BARE
    assert bare.parse_arm("j2048=--labeler.prior adaptive --labeler.reg_m 0").flags == (
        "--labeler.prior", "adaptive", "--labeler.reg_m", "0")
    for text in ("uno", "=--method.name uno", "a/b=--x 1"):
        with pytest.raises(ValueError, match="NAME=FLAGS"):
            bare.parse_arm(text)


def test_seeds_are_a_range_or_a_list_of_distinct_non_negative_integers():
    assert bare.parse_seeds("0-4") == [0, 1, 2, 3, 4]
    assert bare.parse_seeds("3,1,7") == [3, 1, 7]
    for text in ("a", "1,1", "4-2", "1-x"):
        with pytest.raises(ValueError, match="--seeds"):
            bare.parse_seeds(text)


def test_the_command_is_the_bare_cache_command_with_the_arms_flags(tmp_path):
    cmd = bare.train_command("/c/cache", UNO, 3, tmp_path, python="py")
    assert cmd == ["py", "-m", "ncdlr.cli", "train", "--features", "/c/cache", "--seed", "3", "--model.head", "mlp",
                   "--method.name", "uno", "--output", str(tmp_path / "uno-s3")]


def test_a_deadline_is_a_utc_clock_time():
    at = datetime(2026, 12, 7, 17, 56, tzinfo=timezone.utc)
    assert bare.past("17:55", at) and not bare.past("17:56", at) and not bare.past(None, at)
    for text in ("25:00", "17:60", "noon"):
        with pytest.raises(ValueError, match="HH:MM"):
            bare.past(text, at)


def test_the_reading_pairs_the_seeds_every_arm_finished_and_states_the_goal(tmp_path):
    for seed, (b, u) in enumerate([(0.30, 0.20), (0.26, 0.22), (0.28, 0.19)]):
        write_run(tmp_path, "bare", seed, b, 0.50)
        write_run(tmp_path, "uno", seed, u, 0.49)
    write_run(tmp_path, "bare", 3, 0.90, 0.90)  # UNO's seed 3 never finished: not read
    seeds, runs = bare.read_runs(tmp_path, [BARE, UNO], [0, 1, 2, 3])
    assert seeds == [0, 1, 2] and set(runs["bare"]) == {0, 1, 2}
    gap, se = bare.paired([30, 26, 28], [20, 22, 19])
    assert gap == pytest.approx(23 / 3) and se == pytest.approx(math.sqrt(((10 - 23 / 3) ** 2 + (4 - 23 / 3) ** 2
                                                                          + (9 - 23 / 3) ** 2) / 2 / 3))
    text = bare.render(seeds, runs, "uno")
    assert "| 1 | 26.0 / 50.0 | 22.0 / 49.0 |" in text
    bare_row = next(line for line in text.splitlines() if line.startswith("| bare |"))
    assert f"{gap:+.2f} ({se:.2f})" in bare_row and "+1.00 (0.00)" in bare_row
    assert "| 28.1 / 28.0 / 27.9 |" in bare_row  # head / medium / tail means
    assert bare_row.endswith("| met |")  # +7.7 ≥ 5 by more than 2 SE, known +1, std 1.6 ≤ 2


def test_read_only_prints_the_table_and_refuses_an_unknown_baseline(tmp_path, capsys):
    for seed in (0, 1):
        write_run(tmp_path, "bare", seed, 0.25 + seed / 100, 0.5)
        write_run(tmp_path, "uno", seed, 0.24, 0.5)
    assert bare.main(["--features", "unused", "--out", str(tmp_path), "--seeds", "0-1", "--read-only"]) == 0
    assert "novel − uno (SE)" in capsys.readouterr().out
    assert bare.main(["--features", "unused", "--out", str(tmp_path / "none"), "--read-only"]) == 1
    assert "no seed finished by every arm" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        bare.main(["--features", "unused", "--out", str(tmp_path), "--baseline", "paper", "--read-only"])
    assert stop.value.code == 2 and "--baseline 'paper' is not an arm" in capsys.readouterr().err


def test_a_finished_run_is_kept_and_a_failing_one_is_counted_with_its_log(tmp_path, capsys):
    write_run(tmp_path, "bare", 0, 0.3, 0.5)
    broken = bare.Arm("broken", ("--no-such-flag", "1"))
    failed = bare.run_all(str(tmp_path / "no-cache"), [BARE, broken], [0], tmp_path, parallel=2, deadline=None)
    out = capsys.readouterr().out
    assert "bare-s0: done before, kept" in out and not (tmp_path / "bare-s0.log").exists()
    assert failed == 1 and "broken-s0: exit 2" in out
    assert "--no-such-flag" in (tmp_path / "broken-s0.log").read_text()


def write_predictions(out: Path, arm: str, seed: int, y_true: list[int], y_pred: list[int], order=None) -> None:
    """A run's ``predictions.parquet`` as ``ncdlr train`` writes it (the columns read and the report metadata),
    rows in ``order`` (default as given) so that alignment by ``source_id`` is exercised."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    order = order or list(range(len(y_true)))
    table = pa.table({"source_id": [f"img{i:02d}" for i in order], "y_true": [y_true[i] for i in order],
                      "y_pred": [y_pred[i] for i in order]}).replace_schema_metadata(
        {"ncdlr_report": json.dumps({"split": "test", "num_known": 2, "num_classes": 4})})
    (out / f"{arm}-s{seed}").mkdir(parents=True, exist_ok=True)
    pq.write_table(table, out / f"{arm}-s{seed}" / "predictions.parquet")


def test_the_test_split_reading_aligns_images_and_gives_its_resolution_and_the_gaps_test_split_se(tmp_path, capsys):
    # known 0, 1 (three images each), novel 2 (four images) and 3 (two images); predictions are cluster ids that the
    # Hungarian matching over all classes maps back (4 → 2, 5 → 3), so "right" is decided by the matching, as in a run.
    y = [0, 0, 0, 1, 1, 1, 2, 2, 2, 2, 3, 3]
    known = [0, 0, 0, 1, 1, 1]
    runs = {("bare", 0): known + [4, 4, 4, 5, 5, 5],   # novel 2: 3/4, novel 3: 2/2
            ("bare", 1): known + [4, 4, 5, 5, 5, 5],   # 2/4, 2/2
            ("uno", 0): known + [4, 4, 0, 0, 5, 0],    # 2/4, 1/2 (misses go to known columns, which keep their class)
            ("uno", 1): known + [4, 0, 1, 0, 5, 1]}    # 1/4, 1/2
    for (arm, seed), pred in runs.items():
        write_predictions(tmp_path, arm, seed, y, pred, order=None if seed == 0 else list(reversed(range(12))))
    y_true, preds, num_known = bare.read_predictions(tmp_path, [BARE, UNO], [0, 1])
    assert num_known == 2 and y_true.tolist() == y
    assert preds["bare"][1].tolist() == runs[("bare", 1)]  # seed 1's reversed rows put back in source_id order
    text = bare.render_test_split(y_true, preds, num_known, "uno")
    assert "2 novel classes, 6 images (2–4 a class)" in text
    # resolution, bare: p = (0.625, 1.0) averaged over the seeds → 100·sqrt(0.625·0.375/4 + 0)/2
    bare_row = next(line for line in text.splitlines() if line.startswith("| bare |"))
    assert f"| {100 * math.sqrt(0.625 * 0.375 / 4) / 2:.2f} |" in bare_row
    # per-seed gaps (class-mean, %): seed 0 (0.75+1)/2 − (0.5+0.5)/2 = 37.5, seed 1 (0.5+1)/2 − (0.25+0.5)/2 = 37.5;
    # the test split's SE is > 0 (the images of class 2 differ between the arms), the seeds' is 0
    assert "| +37.50 (0.00) |" in bare_row
    split_se, both = (float(cell) for cell in bare_row.strip("| ").split(" | ")[3:])
    assert split_se > 0 and both == pytest.approx(split_se, abs=0.01)
    uno_row = next(line for line in text.splitlines() if line.startswith("| uno |"))
    assert f"| {100 * math.sqrt(0.375 * 0.625 / 4 + 0.25 / 2) / 2:.2f} |" in uno_row
    # a run predicting other images is refused; a run without the file leaves the reading out
    write_predictions(tmp_path, "uno", 2, [3] + y[1:], runs[("uno", 0)])
    write_predictions(tmp_path, "bare", 2, y, runs[("bare", 0)])
    with pytest.raises(ValueError, match="other test images"):
        bare.read_predictions(tmp_path, [BARE, UNO], [0, 2])
    (tmp_path / "uno-s2" / "predictions.parquet").unlink()
    assert bare.read_predictions(tmp_path, [BARE, UNO], [0, 2]) is None
    # and the command prints it after the metrics table
    for (arm, seed), pred in runs.items():
        write_run_metrics = {"novel": 0.5, "known": 1.0, **{f"novel_{g}": 0.5 for g in bare.GROUPS}}
        (tmp_path / f"{arm}-s{seed}" / "metrics.json").write_text(json.dumps(write_run_metrics))
    assert bare.main(["--features", "unused", "--out", str(tmp_path), "--seeds", "0-1", "--read-only"]) == 0
    assert "novel resolution (binomial SE)" in capsys.readouterr().out


def test_the_picture_shows_each_arms_per_seed_gaps_to_the_baseline(tmp_path):
    """``--plot``: the gaps it draws are the paired per-seed gaps (points) with the table's mean and SE, and the file
    is a PNG; a second arm gets its own row, the baseline none."""
    for seed, (b, j, u) in enumerate([(0.30, 0.25, 0.20), (0.26, 0.27, 0.22), (0.28, 0.20, 0.19)]):
        write_run(tmp_path, "bare", seed, b, 0.50)
        write_run(tmp_path, "j2048", seed, j, 0.50)
        write_run(tmp_path, "uno", seed, u, 0.49)
    arms = [BARE, bare.Arm("j2048", ("--labeler.reg_m", "0")), UNO]
    seeds, runs = bare.read_runs(tmp_path, arms, [0, 1, 2])
    rows = bare.gaps(seeds, runs, "uno")
    assert set(rows) == {"bare", "j2048"}
    assert rows["bare"]["per_seed"] == pytest.approx([10.0, 4.0, 9.0])
    assert (rows["bare"]["mean"], rows["bare"]["se"]) == pytest.approx(bare.paired([30, 26, 28], [20, 22, 19]))
    assert rows["j2048"]["per_seed"] == pytest.approx([5.0, 5.0, 1.0])
    path = tmp_path / "pics" / "pairs.png"
    assert bare.main(["--features", "unused", "--arm", "bare=", "--arm", "j2048=--labeler.reg_m 0", "--arm",
                      "uno=--method.name uno", "--out", str(tmp_path), "--read-only", "--plot", str(path)]) == 0
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_runs_of_later_seeds_fill_free_slots_so_a_new_arm_beside_finished_ones_runs_in_parallel(tmp_path, monkeypatch,
                                                                                                capsys):
    """An arm added beside finished runs (session 72: one new arm, two seeds): with ``parallel=2`` both seeds' runs
    are in flight together. Each stand-in run (a real subprocess in place of ``ncdlr train``, which would cost a
    minute) marks that it started and waits up to 20 s for the other's mark; run one at a time, the first would
    give up and fail."""
    write_run(tmp_path, "bare", 0, 0.3, 0.5)
    write_run(tmp_path, "bare", 1, 0.3, 0.5)
    waits = ("import pathlib, sys, time\n"
             "out = pathlib.Path(sys.argv[1]); (out / f'started-{sys.argv[2]}').touch()\n"
             "other = out / f'started-{1 - int(sys.argv[2])}'\n"
             "deadline = time.monotonic() + 20\n"
             "while not other.exists() and time.monotonic() < deadline: time.sleep(0.05)\n"
             "sys.exit(0 if other.exists() else 1)\n")
    monkeypatch.setattr(bare, "train_command", lambda features, arm, seed, out: [sys.executable, "-c", waits,
                                                                                 str(out), str(seed)])
    new = bare.Arm("tight", ("--labeler.relax_tighten", "3"))
    assert bare.run_all("unused", [new, BARE], [0, 1], tmp_path, parallel=2, deadline=None) == 0
    out = capsys.readouterr().out
    assert "tight-s0: exit 0" in out and "tight-s1: exit 0" in out and "bare-s1: done before, kept" in out
