"""The iNaturalist18-2K training job: ``python -m ncdlr.train_inat2k``.

Usage::

    # on a Ray cluster, a prepared iNat18-2K dataset (see `ncdlr prepare inat18`):
    ray job submit -- python -m ncdlr.train_inat2k --data s3://bucket/inat18-2k --num-workers 8 --use-gpu true
    # no data location: the embedded default — a small synthetic iNat-format set served from an embedded
    # S3 server, 2 local CPU workers, evaluation and report — a few minutes on 2 cores:
    python -m ncdlr.train_inat2k
    # the embedded default also runs as a job (`ray job submit -- python -m ncdlr.train_inat2k`): it joins the
    # job's cluster and passes the S3 settings to all tasks and workers through the job's runtime_env. Its
    # server listens on 127.0.0.1 of the driver's machine, so on a multi-machine cluster use --data instead.

With ``--data`` the run is configured by ``configs/inat18_2k.yaml`` (DINO ViT-B/16, last block trained,
frozen expansion to 2000-d, 50 epochs; ``--pretrained s3://.../dino_vitbase16_pretrain.pth``), connecting to
the cluster the job is submitted to. Without it, ``configs/demo.yaml`` is used. Every config field can be
overridden (``--gamma 10``, ``--epochs 5``, ...); ``--output DIR`` is the run directory, printed at the end.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


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
    add_override_arguments(parser)
    return parser


def _config(args: argparse.Namespace, default_file: str):
    from ncdlr.service.config import apply_overrides, load_config, overrides_from_args

    cfg = load_config(args.config or CONFIGS / default_file)
    if args.data:
        cfg.data.uri = args.data
    if args.output:
        cfg.run.output = args.output
    return apply_overrides(cfg, overrides_from_args(args))


def _print_result(result: dict) -> None:
    from ncdlr.service.report import render_summary

    if "test" in result:
        print(render_summary(result["output"]))
    print(f"[ncdlr] finished in {result['seconds']:.0f} s; run directory:")
    print(result["output"])


def run_on_cluster(args: argparse.Namespace) -> dict:
    """Train on the prepared dataset ``args.data`` on the Ray cluster this job runs on (RAY_ADDRESS or local)."""
    from ncdlr.service.trainer import fit

    return fit(_config(args, "inat18_2k.yaml"))


def init_ray_for_embedded(s3_env: dict[str, str]) -> bool:
    """Start or join Ray so that every task and worker of this job gets the embedded S3 client settings.

    ``s3_env`` (:meth:`ncdlr.data.storage.S3Server.env`: endpoint, credentials, region and the AWS checksum
    settings) goes into the job's ``runtime_env``; setting it in this process only would not reach Ray Data
    tasks or workers on other nodes. Inside a submitted job (``RAY_ADDRESS`` set) Ray refuses resource
    arguments, so none are given there; a local Ray gets spare logical CPUs for Ray Data read tasks.
    Returns True when this call started Ray (then the caller shuts it down); with Ray already initialised in
    this process nothing is started and the settings reach the train workers through :func:`fit`'s config.
    """
    import ray

    if ray.is_initialized():
        return False
    runtime_env = {"env_vars": dict(s3_env)}
    if os.environ.get("RAY_ADDRESS"):
        ray.init(runtime_env=runtime_env, log_to_driver=True)
    else:
        ray.init(num_cpus=max(4, os.cpu_count() or 1), object_store_memory=512 * 1024**2, include_dashboard=False,
                 runtime_env=runtime_env, log_to_driver=True)
    return True


def run_embedded(args: argparse.Namespace) -> dict:
    """Synthetic iNat-format data → embedded S3 server → 2 CPU workers → evaluation and report.

    The rclone server listens on 127.0.0.1 of the driver's machine. On a local Ray, and on a simulated
    multi-node cluster whose nodes share this machine, every worker reaches it; on a real multi-machine
    cluster workers on other machines cannot, so there pass ``--data`` on real object storage.
    """
    import ray

    from ncdlr.data.builders import synthetic
    from ncdlr.data.storage import S3Server
    from ncdlr.service.trainer import fit

    cfg = _config(args, "demo.yaml")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ncdlr-s3-") as root, S3Server(root) as server:
        os.environ.update(server.env())  # this driver's own S3 clients (manifest, evaluation)
        bucket = server.make_bucket("ncdlr-demo")
        cfg.data.uri = f"{bucket}/synthetic-inat-{args.classes}"
        print(f"[ncdlr] embedded default: writing a synthetic iNat18-format set ({args.classes} classes) to "
              f"{cfg.data.uri} on the embedded S3 server {server.endpoint_url}", flush=True)
        manifest = synthetic.build(synthetic.SyntheticConfig(num_classes=args.classes, n_max=args.n_max,
                                                             seed=cfg.run.seed),
                                   cfg.data.uri, progress=False)
        print(f"[ncdlr] prepared {manifest.split_counts} in {time.perf_counter() - start:.0f} s", flush=True)
        started = init_ray_for_embedded(server.env())
        try:
            result = fit(cfg)
        finally:
            if started:
                ray.shutdown()
    result["seconds"] = time.perf_counter() - start
    return result


def main(argv: Sequence[str] | None = None) -> int:
    from ncdlr.service.config import ConfigError

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    # Ray Train's default health-check interval (2 s) is kept: polling every 0.1 s slowed the workers' steps
    # by 15-50 % on 2 cores (docs/benchmarks.md), while reporting once per epoch waits at most one interval.
    os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")
    args = build_parser().parse_args(argv)
    try:
        result = run_on_cluster(args) if args.data else run_embedded(args)
    except ConfigError as err:
        print(f"train_inat2k: {err}", file=sys.stderr)
        return 2
    _print_result(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
