"""Train NCDLR with Ray Train (DDP over --num-workers workers) and write the run report.

A run is configured by a YAML file (configs/*.yaml) whose every field can be overridden on the command
line, as --section.key VALUE or, when the name is unique, --key VALUE (e.g. --gamma 10, --num-workers 2,
--labeler.lr 0.1). Unknown keys and values of the wrong type are refused with the key named. The resolved
config is saved as RUN/config.yaml; checkpoints go to --storage-path (local or s3://; default RUN/ray);
TensorBoard logs to RUN/tensorboard; after training the test split is evaluated and RUN/metrics.json,
predictions.parquet, plots and summary.md are written (`ncdlr report RUN` prints the summary).

--num-novel sets the number of novel clusters Ku: 0 (default) takes the data's, N uses N, and "auto" runs
ncdlr estimate-k on the known + novel training features first (feature-table mode: the table's rows; image
mode: embedded with the frozen --model.encoder) and trains with Ks + Ku_est prototypes; the estimate is
logged, written to RUN/num_novel.json, replaces "auto" in RUN/config.yaml and appears in metrics.json as
num_novel_estimated. --posthoc la|crt|la+crt applies a post-hoc fix at the end-of-training evaluation.

Examples:
  ncdlr train --config configs/openclipart.yaml --num-workers 2 --output runs/oc
  ncdlr train --features s3://bucket/features.parquet --output runs/feat --gamma 10 --epochs 20
  ncdlr train --features feats.parquet --num-novel auto --posthoc la    # estimate Ku first; +LA at evaluation
  ray job submit -- ncdlr train --config configs/inat18_2k.yaml --num-workers 8 --use-gpu true
"""

from __future__ import annotations

import argparse

NAME = "train"
HELP = "train a model (Ray Train DDP) from a config file and/or a feature table; evaluate and report"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ncdlr.service.config import add_override_arguments

    parser.add_argument("--config", metavar="YAML", help="config file (configs/*.yaml); built-in defaults if absent")
    parser.add_argument("--features", metavar="URI", default=None,
                        help="feature-table mode: parquet with embedding/label/split (local or s3://); "
                             "trains the head on these embeddings (encoder 'identity', head 'mlp' unless set). "
                             "An activation cache (ncdlr embed --trainable-blocks B) trains the encoder's last "
                             "B blocks and the head on two different cached crops per image; without --config, "
                             "ncdlr labels a cache's novel rows with relaxed cluster sizes on a short buffer "
                             "(labeler.prior uniform, reg_m 0.45, relax_bound known, buffer_epochs 0.2; "
                             "--labeler.* flags override)")
    parser.add_argument("--output", metavar="DIR", default=None, help="run directory (metrics.json at its top)")
    parser.add_argument("--verbose", action="store_true",
                        help="also show Ray's own output (worker logs, reports, checkpoints) and full tracebacks")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace a run already in the run directory (else one with config.yaml or "
                             "metrics.json is refused)")
    add_override_arguments(parser)


def build_config(args: argparse.Namespace):
    """The run's Config from the command line (YAML, these flags, then the overrides; each value parsed once)."""
    from ncdlr.service.config import Setting, args_settings
    from ncdlr.service.entry import config_from_args, feature_table_settings

    settings = feature_table_settings(args.features, args.config, args_settings(args))
    if args.output:
        settings.append(Setting("run.output", args.output))
    if args.verbose:
        settings.append(Setting("run.verbose", True))
    if args.overwrite:
        settings.append(Setting("run.overwrite", True))
    return config_from_args(args, settings=settings)


def run(args: argparse.Namespace) -> int:
    from ncdlr.service.entry import print_result, run_main
    from ncdlr.service.trainer import fit

    def main() -> int:
        print_result(fit(build_config(args)))
        return 0

    return run_main("ncdlr train", main, verbose=args.verbose)
