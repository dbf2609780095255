"""Evaluate a finished training run on its test split (or --split val) and (re)write its report.

RUN is the run directory written by `ncdlr train` (it holds config.yaml and checkpoint.txt naming the
last checkpoint; pass --checkpoint to evaluate another one). Predictions are argmax over all K
prototypes; metrics are the Hungarian-matched All/Known/Novel class-mean accuracies with head/medium/tail
groups (method.md §5), written to RUN/metrics.json with plots and summary.md.

Example:
  ncdlr evaluate runs/demo
"""

from __future__ import annotations

import argparse
import sys

NAME = "evaluate"
HELP = "evaluate a trained run on its test split and write metrics.json, plots and summary.md"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", metavar="RUN", help="run directory of `ncdlr train`")
    parser.add_argument("--checkpoint", default="", help="checkpoint directory (default: the run's last)")
    parser.add_argument("--split", default="test", choices=("test", "val"), help="split to evaluate (default test)")


def run(args: argparse.Namespace) -> int:
    from ncdlr.service.evaluate import evaluate_run
    from ncdlr.service.report import render_summary

    try:
        evaluate_run(args.run, args.checkpoint, args.split)
    except (FileNotFoundError, ValueError) as err:
        print(f"ncdlr evaluate: {err}", file=sys.stderr)
        return 1
    print(render_summary(args.run))
    return 0
