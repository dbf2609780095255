"""What the pool score adds to a rehearsal training: one draw's candidate trained, then scored on ``val`` and on the
pool (the pseudo-novel rows it trained on, :data:`ncdlr.service.rehearsal.POOL_SPLIT`).

The baseline is the training itself (:func:`ncdlr.service.local.train` on the draw's validation problem, scaled as
:func:`ncdlr.service.rehearsal.rehearse` scales it, ``trial_config``), measured in the same run; the pool score is
priced against it (``pool_cost`` = pool-score seconds / training seconds) and against the ``val`` score. Both
scores run ``--repeats`` times on the trained run (median). ``val_rows`` counts every held-out row (a val score predicts them all),
``val_novel_rows`` the pseudo-novel ones it scores; ``pool_rows`` the pseudo-novel training rows. ``la_pool_score_s``
prices a ``method.posthoc=la`` candidate, which shares the training and costs only its own pool score (the prior
fitted on the problem's known and pseudo-labelled rows first): ``la_cost`` = its seconds / training seconds, where a
candidate of its own would cost 1. One JSON line.

Usage:  .venv/bin/python benchmarks/bench_rehearsal.py --dataset fashion-cached [--threads 1]
        .venv/bin/python benchmarks/bench_rehearsal.py --smoke     # the synthetic problem, seconds
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

import quality  # noqa: E402  (the datasets' configs and tables)

from ncdlr.service.rehearsal import POOL_SPLIT, rehearsal_score, trial_config  # noqa: E402
from ncdlr.service.local import train  # noqa: E402
from ncdlr.service.validation import SCORING_SPLIT, ValidationConfig, validation_splits  # noqa: E402


def timed(fn, repeats: int) -> tuple[float, object]:
    """Median seconds of ``repeats`` calls of ``fn`` and its last result."""
    seconds, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds), out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="fashion-cached", choices=list(quality.CACHED))
    parser.add_argument("--smoke", action="store_true", help="the synthetic problem at 1 epoch (for tests)")
    parser.add_argument("--repeats", type=int, default=5, help="score passes to take the median of (default 5)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.smoke:
        name, cfg, splits = "synthetic", quality.dataset_config("synthetic", 1), quality.synthetic_splits(0)
    else:
        from ncdlr.data.features import read_feature_table

        name, cfg = args.dataset, quality.dataset_config(args.dataset, None)
        splits = read_feature_table(quality.CACHED[args.dataset])
    problem, _ = validation_splits(splits, ValidationConfig(seed=0, pseudo_novel_fraction=quality.SELECT_FRACTION))
    trial = trial_config(cfg, splits, problem)
    train_s, run = timed(lambda: train(trial, problem), 1)
    val_s, val = timed(lambda: rehearsal_score(run, problem), args.repeats)
    pool_s, pool = timed(lambda: rehearsal_score(run, problem, POOL_SPLIT), args.repeats)
    la_trial = copy.deepcopy(trial)
    la_trial.method.posthoc = "la"
    la_s, la_pool = timed(lambda: rehearsal_score(run, problem, POOL_SPLIT, cfg=la_trial), args.repeats)
    val_novel_rows = int((problem.labels[SCORING_SPLIT] >= problem.num_known).sum())  # the rows val scores on
    print(json.dumps({"dataset": name, "val_rows": len(problem.labels[SCORING_SPLIT]), "val_novel_rows": val_novel_rows,
                      "pool_rows": len(problem.labels[POOL_SPLIT]), "train_s": round(train_s, 3),
                      "val_score_s": round(val_s, 4), "pool_score_s": round(pool_s, 4),
                      "pool_cost": round(pool_s / train_s, 5), "pool_over_val": round(pool_s / val_s, 2),
                      "val": round(val, 4), "pool": round(pool, 4), "la_pool_score_s": round(la_s, 4),
                      "la_cost": round(la_s / train_s, 5), "la_pool": round(la_pool, 4), "threads": args.threads}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
