"""Ray Data's streaming executor made to wait, not spin, while it has no task whose output it would read (Ray 2.60).

The executor's scheduling loop blocks in ``ray.wait`` (up to 0.1 s) for its running tasks. It does not block at all
in two cases, and then goes round as fast as the GIL lets it: no task runs (every read done, or every operator held
back because the consumer has not taken the blocks already made), or every running task is held in output
back-pressure (its outputs are ready, so ``ray.wait`` returns at once, and the step leaves them unread). Both are
the normal state of a training stream whose step is slower than its reads. Each training stream runs such a loop in
its ``SplitCoordinator`` actor (Ray Train's ``streaming_split``), so an image-mode run with a known and a novel
stream loses about one core to two spinning threads: measured on a 2-core machine, the two coordinators at 60 % and
47 % of a core beside a training worker at 80 %, the executor thread sampled outside ``ray.wait`` in 795 of 796
samples (docs/benchmarks.md, "Ray Data's idle spin", which also measures what the wait gives back).

:func:`install` wraps the loop's ``process_completed_tasks`` so that, in either case (:func:`nothing_to_wait_for`),
it first sleeps ``idle_wait_s`` (20 ms by default; ``NCDLR_RAY_DATA_IDLE_WAIT_S``, 0 turns it off) and then does
what it always does. A block the consumer frees is then noticed up to that much later; a task that finishes while
another operator runs is noticed as before. :func:`install` runs in the driver and, through the
job's ``worker_process_setup_hook`` (:mod:`ncdlr.service.worker_setup`), in every worker process of a job; the
executor's module is patched when it is first imported (:mod:`ncdlr.data.import_patch`), so a worker that never
runs Ray Data never imports it.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

from .import_patch import patch_when_imported

EXECUTOR_MODULE = "ray.data._internal.execution.streaming_executor"  #: where the loop looks the function up
PATCHED_NAME = "process_completed_tasks"
DEFAULT_IDLE_WAIT_S = 0.02
ENV = "NCDLR_RAY_DATA_IDLE_WAIT_S"


def idle_wait_s() -> float:
    """The sleep before a scheduling step with nothing to wait for: ``NCDLR_RAY_DATA_IDLE_WAIT_S`` seconds, else
    20 ms."""
    value = os.environ.get(ENV, "")
    try:
        wait = float(value) if value else DEFAULT_IDLE_WAIT_S
    except ValueError:
        raise ValueError(f"{ENV} must be a number of seconds (0 turns the idle wait off), got {value!r}") from None
    if wait < 0:
        raise ValueError(f"{ENV} must be >= 0 seconds, got {wait}")
    return wait


def nothing_to_wait_for(topology: Any) -> bool:
    """Whether ``ray.wait`` in the next step would return at once for nothing: no operator of an executor's
    ``topology`` (``{operator: state}``) has a task in flight, or every operator that has one was held in output
    back-pressure by the last step (its tasks' finished outputs are ready, so ``ray.wait`` returns them at once, and
    the step leaves them unread; Ray 2.60 marks such an operator with ``_in_task_output_backpressure``)."""
    busy = [op for op in topology if op.get_active_tasks()]
    return all(getattr(op, "_in_task_output_backpressure", False) for op in busy)


def waiting(step: Callable[..., Any], wait_s: float, sleep: Callable[[float], None] = time.sleep) -> Callable[..., Any]:
    """``step(topology, ...)`` preceded by ``sleep(wait_s)`` whenever :func:`nothing_to_wait_for` holds."""

    def process_completed_tasks(topology, *args, **kwargs):
        if nothing_to_wait_for(topology):
            sleep(wait_s)
        return step(topology, *args, **kwargs)

    process_completed_tasks.__wrapped__ = step
    process_completed_tasks.idle_wait_s = wait_s
    return process_completed_tasks


def patch(module: Any, wait_s: float) -> bool:
    """Wrap ``module.process_completed_tasks`` with :func:`waiting` once; False if the module has no such function
    (another Ray version) or ``wait_s`` is 0."""
    step = getattr(module, PATCHED_NAME, None)
    if wait_s <= 0 or step is None:
        return False
    if getattr(step, "idle_wait_s", None) is None:
        setattr(module, PATCHED_NAME, waiting(step, wait_s))
    return True


def install(wait_s: float | None = None) -> bool:
    """Make this process's streaming executors wait ``wait_s`` (default :func:`idle_wait_s`) instead of spinning:
    patch the executor's module now if it is loaded, else when it is imported. False when turned off (0)."""
    wait_s = idle_wait_s() if wait_s is None else wait_s
    if wait_s <= 0:
        return False
    patched = patch_when_imported(EXECUTOR_MODULE, lambda module: patch(module, wait_s))
    return patched is not False  # None: patched when Ray Data's executor is first imported


def installed() -> float | None:
    """The idle wait of this process's executor loop (seconds), or None when it spins (unpatched or not loaded)."""
    module = sys.modules.get(EXECUTOR_MODULE)
    return getattr(getattr(module, PATCHED_NAME, None), "idle_wait_s", None)
