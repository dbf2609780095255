"""Print the evaluation report of a run directory (the Markdown summary written by training/evaluation).

RUN is a local run directory holding metrics.json at its top (as written by `ncdlr train`,
`python -m ncdlr.train_inat2k` or `ncdlr evaluate`). The summary shows All / Known / Novel accuracy
(class-mean, the paper's metric, and instance-averaged) and the head / medium / tail groups; the plots
(confusion_novel.png, tau.png, head_medium_tail.png) sit next to it.

Example:
  ncdlr report runs/demo            # Markdown table
  ncdlr report runs/demo --json     # metrics.json as one JSON object
"""

from __future__ import annotations

import argparse
import json
import sys

from ncdlr.service.report import ReportError, load_metrics, render_summary

NAME = "report"
HELP = "print a run's evaluation summary (All/Known/Novel, head/medium/tail)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", metavar="RUN", help="run directory (holds metrics.json)")
    parser.add_argument("--json", action="store_true", help="print metrics.json as one JSON object instead")


def run(args: argparse.Namespace) -> int:
    try:
        text = json.dumps(load_metrics(args.run)) if args.json else render_summary(args.run).rstrip("\n")
    except ReportError as exc:
        print(f"ncdlr report: {exc}", file=sys.stderr)
        return 1
    print(text)
    return 0
