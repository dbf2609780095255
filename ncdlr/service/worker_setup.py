"""What every worker process of an ncdlr job does first: Ray's ``worker_process_setup_hook`` (:data:`SETUP_HOOK`).

Set by :func:`ncdlr.service.entry.with_worker_setup` for every Ray that ``init_ray`` starts or joins.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

SETUP_HOOK = "ncdlr.service.worker_setup.setup_worker"  #: ``runtime_env["worker_process_setup_hook"]``


def pin_own_cluster(environ: MutableMapping[str, str] = os.environ) -> str | None:
    """Set ``RAY_ADDRESS`` in this worker process to its own cluster's GCS address, unless it is set; return it.

    Ray's state API, asked without an address, resolves one itself: ``RAY_ADDRESS`` if set, else the Ray started
    last on the machine (``/tmp/ray/ray_current_cluster``), which need not be the caller's. Ray Train 2.60's
    ``PlacementGroupCleaner`` asks it every second whether the run's controller actor is alive. When another Ray
    with a dashboard starts on the machine, that cluster answers "no such actor", the cleaner removes the run's
    placement group, and the run ends with "Destroying worker since its placement group was removed". Seen in CI
    (session 37) and twice in session 46; the cleaner's log then says it "Detected that the Ray Train controller
    actor ... is dead" while the controller ran. With the address pinned, the cleaner asks its own cluster."""
    import ray

    if environ.get("RAY_ADDRESS") or not ray.is_initialized():
        return None
    address = ray.get_runtime_context().gcs_address
    environ["RAY_ADDRESS"] = address
    return address


def setup_worker() -> None:
    """The hook: Ray Data's idle wait (:mod:`ncdlr.data.idle_wait`) and :func:`pin_own_cluster`."""
    from ncdlr.data import idle_wait

    idle_wait.install()
    pin_own_cluster()
