"""benchmarks/bare_pairs.py: the bare cache command's arms over paired seeds, run and read.

The reading is checked on hand-written ``metrics.json`` files (the keys a real run writes); the run loop is checked
on what it must not do (train again a finished run) and on a real ``ncdlr train`` subprocess that fails at once on a
flag it does not know (no Ray start): a full training run is every service test's and costs a minute here.
"""

from __future__ import annotations

import json
import math
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
