"""Evaluate a finished training run on its test split (or --split val) and (re)write its report.

RUN is the run directory written by `ncdlr train` (it holds config.yaml and checkpoint.txt naming the
last checkpoint; pass --checkpoint to evaluate another one). Predictions are argmax over all K
prototypes; metrics are the Hungarian-matched All/Known/Novel class-mean accuracies with head/medium/tail
groups (method.md §5), written to RUN/metrics.json with plots and summary.md.

--posthoc applies a post-hoc fix to the trained model first (default: the run's method.posthoc, "none"):
  la      logit adjustment, logits/T - log(prior), the prior counted from the known labels and the model's
          pseudo-labels of the novel training rows (zero-count classes untouched);
  crt     classifier re-training on the frozen embeddings with class-balanced sampling (method.crt_epochs);
  la+crt  cRT, then LA on its scores.
metrics.json names the fix ("posthoc") and keeps the plain accuracies as without_posthoc_all/known/novel.

Examples:
  ncdlr evaluate runs/demo
  ncdlr evaluate runs/demo --posthoc la
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
    parser.add_argument("--posthoc", default="", choices=("none", "la", "crt", "la+crt"),
                        help="post-hoc fix before the report (default: the run's method.posthoc)")


def run(args: argparse.Namespace) -> int:
    from ncdlr.service.entry import run_main
    from ncdlr.service.evaluate import evaluate_run
    from ncdlr.service.report import render_summary

    def main() -> int:
        try:
            evaluate_run(args.run, args.checkpoint, args.split, posthoc=args.posthoc)
        except (FileNotFoundError, ValueError) as err:
            print(f"ncdlr evaluate: {err}", file=sys.stderr)
            return 1
        print(render_summary(args.run))
        return 0

    return run_main("ncdlr evaluate", main)
