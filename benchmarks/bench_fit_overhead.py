"""What one Ray Train run costs before and after its training loop: ``TorchTrainer.fit`` of an empty loop against
the same number of bare Ray actors that start, import torch and set up the same gloo process group, in one run.

The service's end-to-end tests and small runs (a Tune trial, the demo) train for seconds; the rest of their wall
time is this fixed cost. The baseline is what any design on Ray must pay for N training processes (a worker
process each, torch imported, a gloo group formed); the difference is Ray Train's own machinery (its controller
actor, the placement-group cleaner, the train context, the polling until the run is reported done). Rounds
alternate the two, so a noisy machine slows both alike. With ``--stages`` the controller's own log lines
(``[Worker Group Initialization] …`` from Ray Train's structured log) of the last fit are printed too.

Printed: one JSON line with ``fit_s`` and ``actors_s`` (median over rounds, seconds per run), ``ratio`` =
``fit_s / actors_s``, ``overhead_s`` = their difference, each round's figures, the worker count and the CPUs.

Usage::

    .venv/bin/python benchmarks/bench_fit_overhead.py                 # 2 workers, 3 rounds
    .venv/bin/python benchmarks/bench_fit_overhead.py --workers 1 --rounds 5 --stages
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.1")  # as the tests and the service's docs set it
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
sys.path[:0] = [str(Path(__file__).resolve().parent.parent)]


def _empty_loop(config: dict) -> None:
    """The training function of the timed fit: nothing (the process group is already formed by Ray Train)."""


class _Rank:
    """A bare actor: imports torch and joins a gloo process group of ``world`` ranks, as a Train worker does."""

    def setup(self, rank: int, world: int, address: str, port: int) -> bool:
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=f"tcp://{address}:{port}", rank=rank, world_size=world)
        dist.barrier()
        dist.destroy_process_group()
        return True


def time_fit(workers: int, storage: str, name: str) -> float:
    """Seconds of one ``TorchTrainer.fit`` of an empty loop on ``workers`` CPU workers (1 CPU each)."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    start = time.perf_counter()
    TorchTrainer(_empty_loop, scaling_config=ScalingConfig(num_workers=workers, resources_per_worker={"CPU": 1}),
                 run_config=RunConfig(storage_path=storage, name=name)).fit()
    return time.perf_counter() - start


def time_actors(workers: int) -> float:
    """Seconds to start ``workers`` fresh actors (1 CPU each), form their gloo group and end them."""
    import ray

    from ncdlr.data.storage import free_port

    start = time.perf_counter()
    rank_cls = ray.remote(num_cpus=1)(_Rank)
    actors = [rank_cls.remote() for _ in range(workers)]
    port = free_port()
    ray.get([a.setup.remote(r, workers, "127.0.0.1", port) for r, a in enumerate(actors)])
    for actor in actors:
        ray.kill(actor)
    return time.perf_counter() - start


STAGE = re.compile(r'"message": "(\[Worker Group Initialization\][^"]*?)(?:\\n|")')


def controller_stages() -> list[str]:
    """The last run's ``[Worker Group Initialization] …`` lines from Ray Train's controller log, read in this Ray
    session's own log folder (not ``session_latest``, which another Ray on the machine may have taken)."""
    from ray._private.worker import global_worker  # no public API names the session's log folder

    folder = Path(global_worker.node.get_logs_dir_path()) / "train"
    logs = sorted(folder.glob("ray-train-sys-controller-*.log"), key=lambda p: p.stat().st_mtime)
    return STAGE.findall(logs[-1].read_text()) if logs else []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2, help="training workers per run (default 2, as the tests)")
    parser.add_argument("--rounds", type=int, default=3, help="alternations of the two (default 3)")
    parser.add_argument("--cpus", type=int, default=4,
                        help="logical CPUs of the local Ray it starts (default 4, as the tests' ray_local); "
                             "a Ray this process already runs is used as it is")
    parser.add_argument("--stages", action="store_true", help="also print the last fit's start-up stages")
    args = parser.parse_args(argv)
    if args.workers < 1 or args.rounds < 1 or args.cpus < args.workers:
        parser.error("need --workers ≥ 1, --rounds ≥ 1 and --cpus ≥ --workers")

    import ray

    from ncdlr.service.entry import with_worker_setup

    if __name__ != "__main__":  # imported (a test): the workers cannot import benchmarks/, so ship the code itself
        from ray import cloudpickle

        cloudpickle.register_pickle_by_value(sys.modules[__name__])
    started = not ray.is_initialized()  # a caller's Ray (a test's) is used as it is, and left running
    if started:
        ray.init(address="local", num_cpus=args.cpus, include_dashboard=False, log_to_driver=False,
                 logging_level="WARNING", runtime_env=with_worker_setup(None))  # as ncdlr's own Ray
    fits, bare = [], []
    try:
        with tempfile.TemporaryDirectory(prefix="bench-fit-") as storage:
            for r in range(args.rounds):
                fits.append(time_fit(args.workers, storage, f"round{r}"))
                bare.append(time_actors(args.workers))
                print(f"round {r + 1}/{args.rounds}: fit {fits[-1]:.1f} s, bare actors {bare[-1]:.1f} s",
                      file=sys.stderr, flush=True)
        stages = controller_stages() if args.stages else None
    finally:
        if started:
            ray.shutdown()
    fit_s, actors_s = statistics.median(fits), statistics.median(bare)
    print(json.dumps({"fit_s": round(fit_s, 2), "actors_s": round(actors_s, 2), "ratio": round(fit_s / actors_s, 2),
                      "overhead_s": round(fit_s - actors_s, 2), "fit_rounds_s": [round(x, 2) for x in fits],
                      "actors_rounds_s": [round(x, 2) for x in bare], "workers": args.workers,
                      "cpus": os.cpu_count(), **({"stages": stages} if stages is not None else {})}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
