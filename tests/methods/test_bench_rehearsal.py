"""``benchmarks/bench_rehearsal.py --smoke``: the pool score's cost against a rehearsal training, on the synthetic
problem (the real figures are in docs/benchmarks.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_smoke_run_prices_the_pool_score_against_the_training_in_one_json_line():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_rehearsal.py"), "--smoke", "--repeats", "2"],
                         capture_output=True, text=True, check=True, timeout=300).stdout.strip().splitlines()
    line = json.loads(out[-1])
    assert line["dataset"] == "synthetic" and line["pool_rows"] > 0 and line["val_rows"] > 0
    assert line["train_s"] > 0 and line["pool_score_s"] > 0 and 0 <= line["val"] <= 1 and 0 <= line["pool"] <= 1
    assert line["pool_cost"] >= 0 and line["threads"] == 1  # a ratio, not a timing check
    assert line["la_pool_score_s"] > 0 and line["la_cost"] >= 0 and 0 <= line["la_pool"] <= 1  # +LA: a scoring
