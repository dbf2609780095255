"""Ray Data's idle spin: an image-mode training run of the service with the executors' idle wait
(``ncdlr.data.idle_wait``) against the same run without it (``NCDLR_RAY_DATA_IDLE_WAIT_S=0``), in one invocation.

Each run is a child process with its own local Ray (the wait is set per job: in the driver and, by the worker setup
hook, in every worker), running ``ncdlr.service.trainer.fit`` as ``ncdlr train`` does: one worker, host decode,
``--epochs`` epochs of a prepared image set (``--data``; by default a small synthetic set it builds). Rounds
alternate the two settings, so a noisy machine slows both alike. Read from each run: the last epoch's steps/s and
data share (the service's own epoch metrics) and the CPU seconds of the ``SplitCoordinator`` actors, the processes
where the training streams' executors run (read from ``/proc`` while the run lasts; the last reading per process).

Printed: one JSON line per run, then one with the medians and ``ratio`` = steps/s with the wait over steps/s
without it, and ``coordinator_cpu_ratio`` likewise for the coordinators' CPU seconds.

Usage::

    .venv/bin/python benchmarks/bench_idle_wait.py                                  # synthetic 64-px set, 2 rounds
    .venv/bin/python benchmarks/bench_idle_wait.py --data .gpu-data/oc160 --config configs/openclipart.yaml \\
        --epochs 3 --rounds 1 --cpus-per-worker 2
    .venv/bin/python benchmarks/bench_idle_wait.py --smoke                          # CI: the wiring, one round
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

SETTINGS = {"wait": None, "spin": "0"}  #: the variable's value in each child (None: the default wait)


def _stat(pid: int) -> list[str]:
    """The fields of ``/proc/PID/stat`` after the command name (index 1 is the parent's pid, 11 and 12 the user and
    system clock ticks)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def descends_from(pid: int, root: int) -> bool:
    """Whether process ``pid`` is ``root`` or one of its descendants (a local Ray's workers descend from the driver
    that started it; another Ray's on the same machine do not)."""
    while pid > 1:
        if pid == root:
            return True
        pid = int(_stat(pid)[1])
    return False


def coordinator_cpu(stop: threading.Event, seen: dict[int, float], period_s: float = 0.5) -> None:
    """Until ``stop``: the CPU seconds (user + system) of each live ``ray::SplitCoordinator`` process of this
    process's own Ray into ``seen`` (read from Linux's ``/proc``: the command line Ray gives an actor's process, its
    ``stat`` times)."""
    tick, me = os.sysconf("SC_CLK_TCK"), os.getpid()
    while not stop.is_set():
        for pid_dir in Path("/proc").iterdir():
            if not pid_dir.name.isdigit():
                continue
            try:
                pid = int(pid_dir.name)
                if b"SplitCoordinator" not in (pid_dir / "cmdline").read_bytes() or not descends_from(pid, me):
                    continue
                fields = _stat(pid)
                seen[pid] = (int(fields[11]) + int(fields[12])) / tick
            except (OSError, IndexError, ValueError):  # the process ended meanwhile
                continue
        stop.wait(period_s)


def child(args: argparse.Namespace) -> int:
    """One run: ``fit`` of the config on the data; one JSON line."""
    from gpu_quality import train_one

    from ncdlr.data import idle_wait

    out = Path(tempfile.mkdtemp(prefix="bench-idle-"))
    argv = ["--config", args.config, "--data.uri", args.data, "--run.num_workers", "1", "--optim.epochs",
            str(args.epochs), "--run.seed", "0", "--run.use_gpu", "false", "--run.cpus_per_worker",
            str(args.cpus_per_worker), "--output", str(out / "run"), "--overwrite", *args.extra]
    stop, seen = threading.Event(), {}
    sampler = threading.Thread(target=coordinator_cpu, args=(stop, seen), daemon=True)
    sampler.start()
    start = time.perf_counter()
    result = train_one(argv)
    wall = time.perf_counter() - start
    stop.set()
    sampler.join()
    metrics = result.get("metrics", {})
    print(json.dumps({"setting": args.child, "idle_wait_s": idle_wait.installed(),
                      "steps_per_s": metrics.get("steps_per_s"), "data_share": metrics.get("data_share"),
                      "coordinator_cpu_s": round(sum(seen.values()), 2), "coordinators": len(seen),
                      "wall_s": round(wall, 1)}), flush=True)
    return 0


def synthetic_data(root: Path, smoke: bool) -> str:
    """A small long-tailed synthetic set of 64-px JPEGs (the service reads it as any prepared dataset)."""
    from ncdlr.data.builders import synthetic

    uri = str(root / "synthetic")
    cfg = (synthetic.SyntheticConfig(num_classes=6, ratio=4.0, n_max=16, test_per_class=3, image_size=64) if smoke
           else synthetic.SyntheticConfig(num_classes=10, ratio=4.0, n_max=120, test_per_class=4, image_size=64))
    synthetic.build(cfg, uri, progress=False)
    return uri


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="", help="a prepared image set (default: a synthetic 64-px one, built)")
    parser.add_argument("--config", default=str(HERE.parent / "configs" / "demo.yaml"),
                        help="the config the runs start from (default configs/demo.yaml)")
    parser.add_argument("--epochs", type=int, default=3, help="epochs per run (default 3; the last one is read)")
    parser.add_argument("--rounds", type=int, default=2, help="alternations of the two settings (default 2)")
    parser.add_argument("--cpus-per-worker", type=float, default=1.0, help="CPUs the training worker reserves")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, one round, one epoch (CI: the wiring)")
    parser.add_argument("--child", choices=sorted(SETTINGS), help=argparse.SUPPRESS)
    parser.add_argument("--extra", nargs=argparse.REMAINDER, default=[],
                        help="further `ncdlr train` overrides for every run (e.g. --extra --data.batch_size 32)")
    args = parser.parse_args(argv)
    if args.child:
        return child(args)
    if args.epochs < 1 or args.rounds < 1:
        parser.error("need --epochs ≥ 1 and --rounds ≥ 1")
    with tempfile.TemporaryDirectory(prefix="bench-idle-data-") as tmp:
        data = args.data or synthetic_data(Path(tmp), args.smoke)
        epochs, rounds = (1, 1) if args.smoke else (args.epochs, args.rounds)
        extra = (["--data.image_size", "64", "--labeler.buffer_size", "32", "--data.batch_size", "8"]
                 if args.smoke else []) + args.extra
        runs = []
        for _ in range(rounds):
            for setting, value in SETTINGS.items():
                env = {k: v for k, v in os.environ.items() if k != "NCDLR_RAY_DATA_IDLE_WAIT_S"}
                if value is not None:
                    env["NCDLR_RAY_DATA_IDLE_WAIT_S"] = value
                cmd = [sys.executable, str(Path(__file__).resolve()), "--child", setting, "--data", data,
                       "--config", args.config, "--epochs", str(epochs), "--cpus-per-worker",
                       str(args.cpus_per_worker), "--extra", *extra]
                done = subprocess.run(cmd, env=env, capture_output=True, text=True)
                if done.returncode != 0:
                    print(done.stderr[-4000:], file=sys.stderr)
                    return done.returncode
                row = json.loads(done.stdout.strip().splitlines()[-1])
                runs.append(row)
                print(json.dumps(row), flush=True)
    med = {s: {k: statistics.median(r[k] for r in runs if r["setting"] == s)
               for k in ("steps_per_s", "coordinator_cpu_s", "wall_s")} for s in SETTINGS}
    spin_cpu = med["spin"]["coordinator_cpu_s"]
    print(json.dumps({"wait": med["wait"], "spin": med["spin"],
                      "ratio": round(med["wait"]["steps_per_s"] / med["spin"]["steps_per_s"], 3),
                      "coordinator_cpu_ratio": (round(med["wait"]["coordinator_cpu_s"] / spin_cpu, 3)
                                                if spin_cpu else None),
                      "rounds": rounds, "epochs": epochs, "cpus": os.cpu_count(), "data": args.data or "synthetic"}),
          flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
