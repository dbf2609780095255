"""``benchmarks/bench_idle_wait.py``'s reading of the coordinators' CPU time, on real processes (no Ray: a process
whose command line names ``SplitCoordinator``, as Ray titles that actor's process). The benchmark's runs themselves
are two Ray Train runs a round (a minute or more on 2 cores), run by hand (docs/benchmarks.md), not in the suite."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_idle_wait  # noqa: E402


def test_the_sampler_reads_this_processs_own_coordinators_only() -> None:
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\ntime.sleep(30)"
    mine = subprocess.Popen(["bash", "-c", f'exec -a "ray::SplitCoordinator" {sys.executable} -c "{burn}"'])
    # the same name, orphaned (its parent shell exits at once): another Ray's coordinator, not a descendant
    other = int(subprocess.run(["bash", "-c", f'(exec -a "ray::SplitCoordinator" {sys.executable} -c "{burn}") '
                                              f'>/dev/null 2>&1 & echo $!'], capture_output=True, text=True).stdout)
    try:
        assert bench_idle_wait.descends_from(mine.pid, os.getpid())
        stop, seen = threading.Event(), {}
        sampler = threading.Thread(target=bench_idle_wait.coordinator_cpu, args=(stop, seen, 0.1))
        sampler.start()
        while not seen.get(mine.pid, 0) >= 0.29:  # its 0.3 s of CPU, read from /proc (the test's timeout bounds it)
            stop.wait(0.1)
        stop.set()
        sampler.join()
        assert set(seen) == {mine.pid}  # ``other`` has the name but is not a descendant of this process
    finally:
        mine.kill()
        mine.wait()
        os.kill(other, 9)


def test_rounds_and_epochs_are_checked_before_anything_runs() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_idle_wait.py"), "--rounds", "0"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "need --epochs ≥ 1 and --rounds ≥ 1" in out.stderr
