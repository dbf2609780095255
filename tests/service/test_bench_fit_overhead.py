"""``benchmarks/bench_fit_overhead.py``: the fixed cost of one Ray Train run against bare actors doing the same set-up.

Real parts throughout: a local Ray, a real ``TorchTrainer.fit`` and real actors forming a gloo group; one round of
one worker here (the numbers are this machine's and mean little at that size, the keys and their arithmetic do).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = str(ROOT / "benchmarks" / "bench_fit_overhead.py")
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_fit_overhead  # noqa: E402


def test_more_workers_than_cpus_is_refused_before_ray_starts():
    out = subprocess.run([sys.executable, SCRIPT, "--workers", "3", "--cpus", "2"], capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    assert out.returncode == 2 and "--cpus ≥ --workers" in out.stderr and "Started a local Ray" not in out.stderr


@pytest.mark.slow
def test_one_round_prints_both_timings_their_ratio_and_the_start_up_stages(ray_local, capsys):
    """In this process, on the session's Ray (its start is not what is timed); the stages come from this Ray's own
    log folder, not from another xdist process's Ray."""
    assert bench_fit_overhead.main(["--workers", "1", "--rounds", "1", "--stages"]) == 0
    out = capsys.readouterr()
    line = json.loads(out.out.strip().splitlines()[-1])
    assert line["fit_rounds_s"] == [line["fit_s"]] and line["actors_rounds_s"] == [line["actors_s"]]
    assert line["fit_s"] > 0 and line["actors_s"] > 0 and line["workers"] == 1
    # the printed ratio is rounded from unrounded seconds: allow its rounding plus that of the two printed seconds
    recomputed = line["fit_s"] / line["actors_s"]
    rounding = 0.005 + recomputed * (0.005 / line["actors_s"] + 0.005 / line["fit_s"])
    assert line["ratio"] == pytest.approx(recomputed, abs=rounding + 1e-9)
    assert line["overhead_s"] == pytest.approx(line["fit_s"] - line["actors_s"], abs=0.02)
    assert any("worker actors created" in stage for stage in line["stages"])  # read from Ray Train's own log
    assert "round 1/1: fit" in out.err
    import ray

    assert ray.is_initialized()  # the session's Ray is left running for the tests after this one
