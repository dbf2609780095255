"""Time lost to one failure under ``--run.max_failures 1``: the buffer actor or a Ray Train worker killed mid-run.

Three runs of the same tiny feature-table job on a local Ray (1 CPU worker, the synthetic table of
``tests/fixtures/tiny_runs.py`` with ``n_max``; batch 8, ``--epochs`` epochs, γ 5, buffer 64): uninterrupted, then
with the buffer actor killed (``ray.kill(actor, no_restart=False)``, as a crashed actor) and with the train
worker's process killed (``SIGKILL``), each ``--after`` seconds after the run's first checkpoint appeared. Lost
time = the failed run's wall time minus the uninterrupted run's (restart + redone work); it is printed against
the uninterrupted run's mean epoch time, the baseline measured in the same invocation. One JSON line per run,
then a summary line. The restarted runs must also end with the uninterrupted run's test metrics (the resume is
exact), which is printed as ``same_metrics``.

Usage:  .venv/bin/python benchmarks/failure_cost.py [--n-max 1000] [--epochs 4] [--after 0.5]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.fixtures.tiny_runs import tiny_config, write_tiny_table  # noqa: E402


def checkpoints(output: Path) -> list[Path]:
    return sorted(p for p in output.glob("ray/*/checkpoint_*") if p.is_dir())


class Killer(threading.Thread):
    """Waits for the run's first checkpoint, then ``after`` s, then kills ``what`` ("actor" | "worker");
    ``done`` says whether the kill happened (``error`` why not)."""

    def __init__(self, output: Path, what: str, after: float, timeout: float = 600.0):
        super().__init__(daemon=True)
        self.output, self.what, self.after, self.timeout = output, what, after, timeout
        self.done, self.error = False, ""

    def run(self) -> None:
        import ray

        deadline = time.monotonic() + self.timeout
        while not checkpoints(self.output) and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(self.after)
        try:
            if self.what == "actor":
                name = next(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                            if a["namespace"] == "ncdlr" and a["name"].startswith("buffer-"))
                ray.kill(ray.get_actor(name, namespace="ncdlr"), no_restart=False)
            else:
                import psutil  # the process title of a Ray Train worker names its actor class

                workers = [p for p in psutil.process_iter(["cmdline", "create_time"])
                           if "TrainWorker" in " ".join(p.info["cmdline"] or [])]
                worker = max(workers, key=lambda p: p.info["create_time"])  # this run's, not an earlier run's
                os.kill(worker.pid, signal.SIGKILL)
            self.done = True
        except (StopIteration, ValueError):
            self.error = f"no {self.what} to kill"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n-max", type=int, default=1000, help="rows of the largest class (steps per epoch grow with it)")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--after", type=float, default=0.5, help="seconds after the first checkpoint to kill")
    parser.add_argument("--noise", type=float, default=1.2, help="class noise of the table (hard enough to differ by run)")
    args = parser.parse_args(argv)

    import ray

    from ncdlr.service.entry import with_worker_setup
    from ncdlr.service.trainer import fit

    ray.init(address="local", num_cpus=3, include_dashboard=False, log_to_driver=False,
             runtime_env=with_worker_setup(None))  # as ncdlr's own Ray: ncdlr.service.worker_setup
    root = Path(tempfile.mkdtemp(prefix="failure-cost-"))
    table = write_tiny_table(root / "table.parquet", n_max=args.n_max, noise=args.noise)
    results = {}
    for case in ("warm-up", "uninterrupted", "actor", "worker"):  # the first run pays Ray Train's one-off start-up
        cfg = tiny_config(table, root / case, labeler={"gamma": 5.0},
                          run={"num_workers": 1, "cpus_per_worker": 1.0, "max_failures": 1, "checkpoint_every_s": 0.0})
        cfg.data.batch_size, cfg.optim.epochs, cfg.optim.warmup_epochs = 8, args.epochs, 1
        killer = Killer(root / case, case, args.after) if case in ("actor", "worker") else None
        if killer is not None:
            killer.start()
        start = time.perf_counter()
        out = fit(cfg)
        wall = time.perf_counter() - start
        if killer is not None:
            killer.join(timeout=5)
        results[case] = {"case": case, "wall_s": round(wall, 2), "epoch_s": round(out["metrics"]["epoch_s"], 2),
                         "killed": killer.done if killer else None, "error": killer.error if killer else "",
                         "test": {k: round(out["test"][k], 6) for k in ("all", "known", "novel")}}
        print(json.dumps(results[case]), flush=True)
    base = results["uninterrupted"]
    for case in ("actor", "worker"):
        lost = results[case]["wall_s"] - base["wall_s"]
        same = all(abs(results[case]["test"][k] - base["test"][k]) < 1e-6 for k in base["test"])
        print(json.dumps({"failure": case, "lost_s": round(lost, 1), "epoch_s": base["epoch_s"],
                          "lost_per_epoch": round(lost / base["epoch_s"], 2), "same_metrics": same}))
    ray.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
