"""The iNaturalist18-2K training job: ``python -m ncdlr.train_inat2k``.

Usage::

    # on a Ray cluster, a prepared iNat18-2K dataset (see `ncdlr prepare inat18`):
    ray job submit -- python -m ncdlr.train_inat2k --data s3://bucket/inat18-2k --num-workers 8 --use-gpu true
    # no data location: the embedded default — a small synthetic iNat-format set served from an embedded
    # S3 server, 2 local CPU workers, evaluation, report and a gallery page of every class (runs/demo/gallery)
    # — a few minutes on 2 cores:
    python -m ncdlr.train_inat2k
    # the embedded default also runs as a job (`ray job submit -- python -m ncdlr.train_inat2k`): it joins the
    # job's cluster and passes the S3 settings to all tasks and workers through the job's runtime_env. Its
    # server listens on 127.0.0.1 of the driver's machine, so on a multi-machine cluster use --data instead.

With ``--data`` the run is configured by ``configs/inat18_2k.yaml`` (DINO ViT-B/16, last block trained,
frozen expansion to 2000-d, 50 epochs; ``--pretrained s3://.../dino_vitbase16_pretrain.pth``), connecting to
the cluster the job is submitted to. Without it, ``configs/demo.yaml`` is used. Every config field can be
overridden (``--gamma 10``, ``--epochs 5``, ...); ``--output DIR`` is the run directory, printed at the end.
A run directory that holds a run already is refused unless ``--overwrite``; the embedded default replaces its
own default directory (``runs/demo`` of configs/demo.yaml, no ``--output`` given), so ``make demo`` reruns.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from collections.abc import Sequence


def build_parser() -> argparse.ArgumentParser:
    from ncdlr.service.config import add_override_arguments

    parser = argparse.ArgumentParser(prog="python -m ncdlr.train_inat2k", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", metavar="URI", default="",
                        help="prepared iNat18-2K dataset (s3:// or path); absent → the embedded synthetic default")
    parser.add_argument("--config", metavar="YAML", default="",
                        help="config file (default configs/inat18_2k.yaml with --data, configs/demo.yaml without)")
    parser.add_argument("--output", metavar="DIR", default=None, help="run directory (default from the config)")
    parser.add_argument("--classes", type=int, default=20,
                        help="embedded default only: synthetic classes (half known, half novel); 20 fits 2 cores")
    parser.add_argument("--n-max", type=int, default=120,
                        help="embedded default only: training images of each half's head class (tail = n_max/10)")
    parser.add_argument("--verbose", action="store_true",
                        help="also show Ray's own output (worker logs, reports, checkpoints) and full tracebacks")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace a run already in the run directory (else one with config.yaml or metrics.json "
                             "is refused); the embedded default always replaces its own default runs/demo")
    add_override_arguments(parser)
    return parser


def build_config(args: argparse.Namespace, data_uri: str = ""):
    """The run's Config: ``configs/inat18_2k.yaml`` with ``--data`` (``configs/demo.yaml`` without), these flags,
    then the overrides."""
    from ncdlr.service.config import Setting
    from ncdlr.service.entry import CONFIGS, config_from_args

    settings = [Setting("data.uri", data_uri or args.data)] if (data_uri or args.data) else []
    if args.output:
        settings.append(Setting("run.output", args.output))
    if args.verbose:
        settings.append(Setting("run.verbose", True))
    if args.overwrite or _demo_directory(args):
        settings.append(Setting("run.overwrite", True))
    default = CONFIGS / ("inat18_2k.yaml" if args.data else "demo.yaml")
    return config_from_args(args, default_file=default, settings=settings)


def _demo_directory(args: argparse.Namespace) -> bool:
    """True when the embedded default writes to its own default run directory (configs/demo.yaml's
    ``runs/demo``: no ``--data``, ``--config``, ``--output`` or ``--run.output``), which each demo run replaces."""
    return not (args.data or args.config or args.output or vars(args).get("override:run.output"))


def run_embedded(args: argparse.Namespace) -> dict:
    """Synthetic iNat-format data → embedded S3 server → 2 CPU workers → evaluation, report and gallery.

    The rclone server listens on 127.0.0.1 of the driver's machine. On a local Ray, and on a simulated
    multi-node cluster whose nodes share this machine, every worker reaches it; on a real multi-machine
    cluster workers on other machines cannot, so there pass ``--data`` on real object storage. The server's
    settings go into the job's ``runtime_env`` (setting them in this process only would not reach Ray Data
    tasks or workers on other nodes); with Ray already initialised in this process they reach the train
    workers through :func:`~ncdlr.service.trainer.fit`'s loop config.
    """
    import ray

    from ncdlr.data.builders import synthetic
    from ncdlr.data.storage import S3Server
    from ncdlr.service.entry import init_ray
    from ncdlr.service.gallery import build_gallery
    from ncdlr.service.trainer import fit

    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ncdlr-s3-") as root, S3Server(root) as server:
        os.environ.update(server.env())  # this driver's own S3 clients (manifest, evaluation)
        bucket = server.make_bucket("ncdlr-demo")
        cfg = build_config(args, data_uri=f"{bucket}/synthetic-inat-{args.classes}")
        print(f"[ncdlr] embedded default: writing a synthetic iNat18-format set ({args.classes} classes) to "
              f"{cfg.data.uri} on the embedded S3 server {server.endpoint_url}", flush=True)
        manifest = synthetic.build(synthetic.SyntheticConfig(num_classes=args.classes, n_max=args.n_max,
                                                             seed=cfg.run.seed),
                                   cfg.data.uri, progress=False)
        print(f"[ncdlr] prepared {manifest.split_counts} in {time.perf_counter() - start:.0f} s", flush=True)
        started = init_ray(runtime_env={"env_vars": server.env()}, object_store_bytes=512 * 1024**2,
                           verbose=cfg.run.verbose)
        try:
            result = fit(cfg)
            page = build_gallery(result["output"], str(Path(result["output"]) / "gallery"), progress=False)
            print(f"[ncdlr] a page of every class, novel clusters first: {page.absolute().as_uri()}", flush=True)
        finally:
            if started:
                ray.shutdown()
    result["seconds"] = time.perf_counter() - start
    return result


def main(argv: Sequence[str] | None = None) -> int:
    from ncdlr.service.entry import print_result, run_main
    from ncdlr.service.trainer import fit

    # Ray Train's default health-check interval (2 s) is kept: polling every 0.1 s slowed the workers' steps
    # by 15-50 % on 2 cores (docs/benchmarks.md), while reporting once per epoch waits at most one interval.
    os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")
    args = build_parser().parse_args(argv)

    def run() -> int:
        print_result(fit(build_config(args)) if args.data else run_embedded(args))
        return 0

    return run_main("train_inat2k", run, verbose=args.verbose)


if __name__ == "__main__":
    sys.exit(main())
