"""Choose between config candidates on your own table, without a novel label or a test image.

Each --candidate NAME KEY=VALUE [KEY=VALUE ...] is the base config (--config, then the config overrides) with
those edits; the base itself is the candidate "config", kept unless another one beats it. Every candidate
trains on the same validation draws (paired). With --problem planted (the default; docs/tuning.md) a fifth
of the known classes is planted among the table's real unlabeled rows, and each run is scored by the planted
classes' F1 against its clusters of the whole pool: the real problem's sizes, tail and number of clusters,
and no novel label read (their labels are replaced before anything uses them). --problem known poses the
pseudo-novel classes alone. Only the table's known and novel rows are read; its test rows never are.

The choice is the higher mean over the draws (the rule the dataset configs were chosen by since session 27
of docs/results.md); --margin-se 2 keeps the base unless a candidate's paired gap clears two standard errors.

Cost: candidates × draws trainings of the config in this process (--threads; a cached Fashion-MNIST-LT
run ≈ 100 s, OpenClipart-LT ≈ 200 s on one core). A candidate that changes only the post-hoc fix
(method.posthoc=la) shares each draw's training with the candidates it trains like, and is scored after its
fix, so it costs a scoring, not a training. Each training is recorded in
OUTPUT/rehearsal.json as it ends: rerunning the same command resumes, a larger --draws extends, and a record
made with other configs for a candidate's name is refused. Outputs: rehearsal.md (the table, also printed),
draws.png (each candidate's score per draw), best.yaml (the chosen candidate's config:
`ncdlr train --config OUTPUT/best.yaml`).

Examples:
  # the OpenClipart-LT config's known-vs-novel term and class-balanced known loss, on or off, on your table
  ncdlr rehearse --features s3://bucket/cache --config configs/openclipart.yaml \\
      --candidate without-pair method.task_weight=0 method.known_reweight=0 --draws 8 --output runs/rehearse
  # the config's predictions plain or after the logit adjustment by the pseudo-label prior (one training per draw)
  ncdlr rehearse --features s3://bucket/cache --config configs/openclipart.yaml --candidate la method.posthoc=la
  # held against relaxed cluster sizes, scored on the known problem
  ncdlr rehearse --features feats.parquet --candidate relaxed labeler.prior=uniform labeler.reg_m=0.45 \\
      --problem known --score val
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

NAME = "rehearse"
HELP = "choose between config candidates on your table by a rehearsal on its known classes (no novel label read)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ncdlr.service.config import add_override_arguments
    from ncdlr.service.setting_rehearsal import PROBLEMS, SCORES, RehearsalPlan

    defaults = RehearsalPlan()
    parser.add_argument("--features", metavar="URI", required=True,
                        help="feature table or activation cache (ncdlr embed; local or s3://) the real run trains on")
    parser.add_argument("--config", metavar="YAML", help="base config (configs/*.yaml); built-in defaults if absent")
    parser.add_argument("--candidate", nargs="+", action="append", default=[], metavar="NAME KEY=VALUE",
                        help="a candidate: a name, then the config edits it makes (section.key=value, or a unique "
                             "key=value); give it once per candidate. The base config is the candidate 'config'")
    parser.add_argument("--problem", choices=PROBLEMS, default=defaults.problem,
                        help="planted: a fifth of the known classes planted among the real unlabeled rows, scored "
                             "in the whole pool (the rehearsal of record); known: the pseudo-novel classes alone")
    parser.add_argument("--score", choices=SCORES, default=defaults.score,
                        help="pool: the planted classes' F1 in the pool (known problem: the pseudo-novel training "
                             "rows' accuracy); val: the held-out pseudo-novel images' class-mean accuracy")
    parser.add_argument("--draws", type=int, default=defaults.draws,
                        help=f"validation draws every candidate trains on, at least 2 ({defaults.draws}; one SE "
                             "of a planted F1 gap was 1.6–4.7 points at 8 draws on the benchmark's sets)")
    parser.add_argument("--margin-se", type=float, default=defaults.margin_se,
                        help="standard errors of the paired gap a candidate must clear to replace the base "
                             "(0: the higher mean)")
    parser.add_argument("--pseudo-novel-fraction", type=float, default=defaults.pseudo_novel_fraction,
                        help="share of the known classes hidden per draw (0.2)")
    parser.add_argument("--output", metavar="DIR", default="runs/rehearse",
                        help="rehearsal.json (the resumable record), rehearsal.md, draws.png, best.yaml")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch threads of the trainings (0: torch's default, every core); 1 to run several "
                             "rehearsals side by side")
    parser.add_argument("--json", action="store_true",
                        help='print one JSON object as the last line: {"choice", "rows": [...], "best_config"}')
    parser.add_argument("--verbose", action="store_true", help="full tracebacks on errors")
    add_override_arguments(parser, exclude=("data.features",))


def base_settings(args: argparse.Namespace) -> list:
    """The base config's settings: the YAML file, the table (with a bare table's head defaults, as ``ncdlr
    train --features``), then the command-line overrides."""
    from ncdlr.service.config import args_settings, yaml_settings
    from ncdlr.service.entry import feature_table_settings

    overrides = args_settings(args)
    return ((yaml_settings(args.config) if args.config else [])
            + feature_table_settings(args.features, args.config, overrides) + overrides)


def run(args: argparse.Namespace) -> int:
    from ncdlr.service.entry import run_main

    return run_main("ncdlr rehearse", lambda: rehearse(args), verbose=args.verbose)


def rehearse(args: argparse.Namespace) -> int:
    from ncdlr.data.features import read_feature_table
    from ncdlr.service.entry import EXIT_INTERRUPTED
    from ncdlr.service.config import ConfigError, save_config
    from ncdlr.service.setting_rehearsal import (RECORD_NAME, RehearsalPlan, candidate_configs, load_record,
                                                 parse_candidate, pending, plot_draws, render_table,
                                                 run_rehearsal, summarise)

    if not args.candidate:
        raise ConfigError("give at least one --candidate NAME KEY=VALUE: the base config alone leaves nothing to "
                          "choose")
    try:
        plan = RehearsalPlan(args.problem, args.score, args.draws, args.margin_se, args.pseudo_novel_fraction)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    configs = candidate_configs(base_settings(args), [parse_candidate(tokens) for tokens in args.candidate])
    if args.threads < 0:
        raise ConfigError(f"--threads must be 0 (torch's default) or more, got {args.threads}")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    out = Path(args.output)
    record = load_record(out / RECORD_NAME, args.features, plan, configs)
    splits = read_feature_table(args.features, splits=("known", "novel"),
                                endpoint_url=configs["config"].data.endpoint_url or None)
    todo = len(pending(record, plan))
    print(f"rehearsing {len(configs)} candidates ({', '.join(configs)}) on {plan.draws} {plan.problem} draws of "
          f"{args.features}: Ks = {splits.num_known}, {len(splits.features['novel'])} unlabeled rows; "
          f"{todo} trainings to run, {len(configs) * plan.draws - todo} recorded in {out / RECORD_NAME}", flush=True)
    seconds: list[float] = []

    def progress(draw: int, name: str, result: dict, done: int, total: int) -> None:
        seconds.append(result["seconds"])
        left = (total - done) * sum(seconds) / len(seconds)
        print(f"[draw {draw + 1}/{plan.draws}] {name}: pool {100 * result['pool']:.1f} %, val "
              f"{100 * result['val']:.1f} % ({result['seconds']:.0f} s; {done}/{total} done, ~{left / 60:.0f} min "
              f"left)", flush=True)

    try:
        run_rehearsal(configs, splits, plan, record, out / RECORD_NAME, progress)
    except KeyboardInterrupt:
        kept = sum(len(by_draw) for by_draw in record.scores.values())
        print(f"ncdlr rehearse: interrupted; {kept} trainings are recorded in {out / RECORD_NAME}, and the same "
              f"command resumes from there", file=sys.stderr)
        return EXIT_INTERRUPTED
    rows, choice = summarise(record, plan)
    table = render_table(rows, choice, plan)
    print(table)
    (out / "rehearsal.md").write_text(table + "\n")
    plot_draws(out / "draws.png", record, plan, choice)
    save_config(configs[choice], out / "best.yaml")
    print(f"choice: {choice!r}; its config: {out / 'best.yaml'} (ncdlr train --config {out / 'best.yaml'}); "
          f"per draw: {out / 'draws.png'}")
    if args.json:
        print(json.dumps({"choice": choice, "best_config": str(out / "best.yaml"),
                          "rows": [{"name": r.name, "mean": r.mean, "gap": r.gap, "se": r.se, "won": r.won,
                                    "draws": r.draws} for r in rows]}))
    return 0
