"""What every Ray worker process of an ncdlr job sets up first: the job's ``worker_process_setup_hook``.

Two workarounds for the pinned Ray (2.60), each checked by a test that fails if an upgrade moves what it patches:

- Ray Data's executor waits instead of spinning while it has nothing to wait for (:mod:`ncdlr.data.idle_wait`).
- Ray Train's placement-group cleaner asks the run's own cluster whether the run's controller lives
  (:func:`controller_alive`). Ray Train 2.60 starts a detached ``PlacementGroupCleaner`` beside every run; once a
  second it calls ``is_actor_alive(controller_id)``, which goes through Ray's state API with no address. That
  resolves to the cluster named in ``ray_current_cluster`` (written by the last ``ray start`` or
  ``ray.cluster_utils.Cluster`` on the machine, live or dead) or to the dashboard on the default port, not to the
  cluster the cleaner runs in. When another Ray runs on the machine (a test's ``cluster_utils.Cluster``, another
  user's job) it answers "no such actor", and the cleaner removes the live run's placement group: the run dies with
  "Destroying worker since its placement group was removed" (reproduced: docs/results.md, "Session 46b reading";
  ``tests/service/test_worker_setup.py``). :func:`controller_alive` asks the GCS this worker is connected to.

:func:`setup_worker` installs both; ``ncdlr.service.entry.init_ray`` names it in the job's runtime_env
(:data:`SETUP_HOOK`) and installs both in the driver too. Each module is patched when it is first imported
(:mod:`ncdlr.data.import_patch`), so a worker that never runs Ray Data or Ray Train never loads them.
"""

from __future__ import annotations

from types import ModuleType

from ncdlr.data import idle_wait
from ncdlr.data.import_patch import patch_when_imported

SETUP_HOOK = "ncdlr.service.worker_setup.setup_worker"  #: ``runtime_env["worker_process_setup_hook"]``
CLEANER_MODULE = "ray.train.v2._internal.execution.controller.placement_group_cleaner"
CLEANER_CHECK = "is_actor_alive"  #: the name the cleaner's monitor loop looks up in its module


def controller_alive(actor_id: str, timeout: float | None = None) -> bool:
    """Whether the actor ``actor_id`` (hex) is not dead, asked of the GCS this process is connected to (``timeout``
    is the replaced call's and unused: the GCS client has its own). An actor the GCS does not know counts as dead,
    as in Ray's own check. A failed query raises ``RayStateApiException``, on which the cleaner keeps watching."""
    import ray._private.state
    from ray.util.state.exception import RayStateApiException

    try:
        info = ray._private.state.actors(actor_id=actor_id)
    except Exception as err:  # the GCS unreachable for a moment: the cleaner logs it and asks again
        raise RayStateApiException(f"could not ask the GCS about actor {actor_id}: {err}") from err
    return bool(info) and info.get("State") != "DEAD"


def patch_cleaner(module: ModuleType) -> bool:
    """Point ``module``'s liveness check (Ray Train's cleaner module) at :func:`controller_alive`; False if the
    module has no such check (another Ray version)."""
    if not hasattr(module, CLEANER_CHECK):
        return False
    setattr(module, CLEANER_CHECK, controller_alive)
    return True


def install() -> None:
    """Both workarounds in this process: now for a module already loaded, else when it is first imported."""
    idle_wait.install()
    patch_when_imported(CLEANER_MODULE, patch_cleaner)


def setup_worker() -> None:
    """The ``worker_process_setup_hook`` of every ncdlr job: :func:`install` in a Ray worker process."""
    install()
