"""What every entry point shares: the config from ``argv`` (parsed once), one ``init_ray``, the final output.

``ncdlr train``, ``python -m ncdlr.train_inat2k``, ``ncdlr embed`` and ``tuning/gamma_search.py`` all build
their :class:`~ncdlr.service.config.Config` with :func:`config_from_args` (defaults ← the method's
requirements ← YAML ← the command's own flags ← ``--section.key`` overrides, each value checked once), start or
join Ray with :func:`init_ray`, and end with :func:`print_result`. :func:`run_main` turns the errors a user can
fix (bad config, data, storage, checkpoint) into one line and exit code 2.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from .config import Config, Setting, args_settings, resolve, yaml_settings

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def config_from_args(args, *, default_file: str | Path | None = None, settings: list[Setting] = ()) -> Config:
    """The run's Config: the YAML file (``args.config`` or ``default_file``), then ``settings`` (what the
    command's own flags say, e.g. ``--features``), then the ``--section.key`` overrides given on the command line."""
    path = getattr(args, "config", None) or default_file
    return resolve((yaml_settings(path) if path else []) + list(settings) + args_settings(args))


def feature_table_settings(features: str | None, config: str | None, overrides: Sequence[Setting] = ()
                           ) -> list[Setting]:
    """What ``--features URI`` says: the table, and for a bare table (no config file) a head trained on its
    embeddings (encoder ``identity``, head ``mlp``); an activation cache's encoder is read from the table, and a bare
    one also sets ncdlr's labeler (:func:`~ncdlr.service.bare_cache.bare_cache_settings`, which reads the table).
    ``overrides``: the command line's settings, which come after these and win (the method and the S3 endpoint
    are read from them)."""
    if not features:
        return []
    settings = [Setting("data.features", features)]
    if not config:
        from .bare_cache import bare_cache_settings

        settings += [Setting("model.encoder", "identity"), Setting("model.head", "mlp")]
        settings += bare_cache_settings(features, overrides)
    return settings


def init_ray(*, cpus_needed: float = 0, runtime_env: dict | None = None, verbose: bool = False,
             object_store_bytes: int | None = None) -> bool:
    """Start or join Ray once for this process; True when this call started it (the caller then shuts it down).

    Inside a submitted job or next to a running cluster (``RAY_ADDRESS``; ``RAY_ADDRESS=auto`` joins the cluster
    that ``ray start`` left on this machine) it joins; Ray refuses resource arguments there. Otherwise it always
    starts a new local Ray (``address="local"``), never an unrelated one found on the machine. A local Ray gets
    at least ``cpus_needed`` logical CPUs — more than the workers take, or Ray Data read tasks starve (platform
    notes). On a loaded machine Ray's raylet can miss its fixed 30 s start-up wait; the local start is then tried
    once more (``LOCAL_START_ATTEMPTS``) with a line on stderr. ``runtime_env`` reaches every task and worker (e.g. the
    embedded S3 server's settings). Workers' output reaches this terminal only with ``verbose``. Here and in
    every worker of the job, two workarounds for the pinned Ray are installed (:mod:`ncdlr.service.worker_setup`):
    Ray Data's executors wait instead of spinning while none of their tasks runs (``NCDLR_RAY_DATA_IDLE_WAIT_S=0``
    leaves them as Ray ships them), and Ray Train's placement-group cleaner asks this cluster, not the last one
    started on the machine, whether a run lives.
    """
    import ray

    if ray.is_initialized():
        return False
    if not verbose:
        quiet_ray_consoles()
    kwargs: dict = {"logging_level": logging.INFO if verbose else logging.WARNING}
    kwargs["runtime_env"] = with_worker_setup(runtime_env)
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=verbose, **kwargs)
        return True
    local = dict(address="local", num_cpus=int(max(os.cpu_count() or 1, cpus_needed, 4)), include_dashboard=False,
                 log_to_driver=verbose, **({"object_store_memory": object_store_bytes} if object_store_bytes else {}),
                 **kwargs)
    for attempt in range(1, LOCAL_START_ATTEMPTS):  # every try but the last: a start-up timeout tries again
        try:
            ray.init(**local)
            return True
        except Exception as err:  # Ray raises a bare Exception when its raylet misses the 30 s start-up wait
            if not is_startup_timeout(err):
                raise
            ray.shutdown()  # clears the driver's state; the half-started node's processes are reaped when this
            #                 process exits (Ray's reaper), the new try uses fresh ports beside them
            print(f"ncdlr: Ray's local start timed out (a loaded machine?); trying again "
                  f"({attempt + 1}/{LOCAL_START_ATTEMPTS})", file=sys.stderr, flush=True)
    ray.init(**local)  # the last try: its error is Ray's own
    return True


LOCAL_START_ATTEMPTS = 2


def with_worker_setup(runtime_env: dict | None) -> dict:
    """``runtime_env`` with :mod:`ncdlr.service.worker_setup` as its worker setup hook (unless a hook is already
    set), after installing its workarounds in this process: Ray Data's executor loop sleeps instead of spinning
    while it has nothing to wait for (its ``SplitCoordinator`` actors above all), and Ray Train's placement-group
    cleaner asks the run's own cluster whether the run lives. An idle wait set by ``NCDLR_RAY_DATA_IDLE_WAIT_S``
    travels in ``env_vars`` too: a cluster's workers do not see the driver's environment."""
    from ncdlr.data import idle_wait

    from . import worker_setup

    worker_setup.install()
    env = dict(runtime_env or {})
    env.setdefault("worker_process_setup_hook", worker_setup.SETUP_HOOK)
    if idle_wait.ENV in os.environ:
        env["env_vars"] = {idle_wait.ENV: os.environ[idle_wait.ENV], **env.get("env_vars", {})}
    return env


def is_startup_timeout(err: BaseException) -> bool:
    """Whether ``ray.init`` gave up because the local raylet did not register within Ray's fixed 30 s."""
    return "timed out during startup" in str(err)


def quiet_ray_consoles() -> None:
    """Ray's INFO lines off this terminal (Ray Data's console handler at WARNING; its log file keeps all)."""
    import ray.data  # noqa: F401  (configures Ray Data's loggers on import; adjust them after)

    for name in ("ray.train", "ray.tune"):
        logging.getLogger(name).setLevel(logging.WARNING)
    for handler in logging.getLogger("ray.data").handlers:
        if "File" not in type(handler).__name__:  # the console handler, not ray-data.log
            handler.setLevel(logging.WARNING)


def print_result(result: dict) -> None:
    """The report table (when the run was evaluated), the time and the run directory (last line)."""
    from .report import render_summary

    if "test" in result:
        print(render_summary(result["output"]))
    print(f"[ncdlr] finished in {result['seconds']:.0f} s; run directory:")
    print(result["output"])


def user_errors() -> tuple[type[BaseException], ...]:
    """Errors whose message tells the user what to fix: shown as one line, exit code 2."""
    from ncdlr.data.features import FeatureTableError
    from ncdlr.data.manifest import DatasetFormatError
    from ncdlr.data.storage import StorageError
    from ncdlr.methods import MethodConfigError

    from .checkpoint import CheckpointError
    from .config import ConfigError
    from .names import NamesError
    from .trained_run import RunError

    return (ConfigError, MethodConfigError, FeatureTableError, DatasetFormatError, StorageError, CheckpointError,
            RunError, NamesError)


class RunInterrupted(Exception):
    """A run stopped by the user (SIGINT / Ctrl-C); the message says where its last checkpoint is."""


EXIT_INTERRUPTED = 130  #: the shell's code for a process ended by SIGINT


def run_main(prog: str, main: Callable[[], int], verbose: bool = False) -> int:
    """``main()``, with the errors of :func:`user_errors` as one line ``prog: message`` and exit code 2
    (the traceback too with ``verbose``), and an interrupted run as one line and exit code 130."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    for name in ("botocore", "boto3", "urllib3"):  # "Found credentials in environment variables." on every client
        logging.getLogger(name).setLevel(logging.WARNING)
    try:
        return main()
    except RunInterrupted as err:
        print(f"{prog}: {err}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except user_errors() as err:
        if verbose:
            raise
        print(f"{prog}: {err}", file=sys.stderr)
        return 2
