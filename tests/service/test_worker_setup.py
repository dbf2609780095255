"""``ncdlr.service.worker_setup``: the job's worker setup hook, and Ray Train's placement-group cleaner made to ask
the run's own cluster whether the run lives.

Without it, a ``ray.cluster_utils.Cluster`` started on the machine beside a running Ray Train 2.60 run made the
run's cleaner (asking Ray's state API with no address, which resolves to the cluster started last) remove the live
run's placement group within seconds: the run died with "Destroying worker since its placement group was removed"
(reproduced at 18-22 s in session 46 and 47, ``docs/results.md``, "Session 46b reading"). The last test starts such
a cluster beside a real run in the tests' Ray.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

from ncdlr.service import worker_setup


def test_the_cleaner_is_patched_when_ray_train_first_imports_it() -> None:
    """In a fresh interpreter: ``install`` loads neither module itself; Ray Train's cleaner module, once imported,
    checks liveness with ``controller_alive``. Ray 2.60 (the pinned version) has the check where the patch puts it
    and its monitor loop calls it by that name: if an upgrade moves either, this fails."""
    code = textwrap.dedent("""
        import inspect, sys
        from ncdlr.service import worker_setup
        worker_setup.install()
        print(worker_setup.CLEANER_MODULE in sys.modules)
        from ray.train.v2._internal.execution.controller import placement_group_cleaner as module
        print(module.is_actor_alive is worker_setup.controller_alive)
        print("is_actor_alive(" in inspect.getsource(module.PlacementGroupCleaner._monitor_loop))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True", "True"]


def test_patch_cleaner_refuses_a_module_without_the_check() -> None:
    assert not worker_setup.patch_cleaner(type(sys)("another_ray_version"))


@pytest.mark.slow
def test_controller_alive_answers_from_the_own_cluster(ray_local) -> None:
    """A live actor is alive; a killed one and an id the cluster never knew are not."""
    import ray

    @ray.remote(num_cpus=0)
    class Controller:
        def actor_id(self) -> str:
            return ray.get_runtime_context().get_actor_id()

    actor = Controller.remote()
    actor_id = ray.get(actor.actor_id.remote())
    assert worker_setup.controller_alive(actor_id) is True
    ray.kill(actor)
    deadline = time.monotonic() + 30
    while worker_setup.controller_alive(actor_id) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert worker_setup.controller_alive(actor_id) is False
    assert worker_setup.controller_alive("ab" * 16) is False


@pytest.mark.slow
def test_a_train_run_survives_a_cluster_started_beside_it(ray_local, tmp_path) -> None:
    """A Ray Train run (in the tests' Ray, which has the hook as ``init_ray`` gives it) waits while another process
    starts a ``ray.cluster_utils.Cluster`` on the machine and keeps it up for 8 s — the unpatched cleaner asks once a
    second and removed the run's placement group within 7 s of such a start — then ends; the run must finish."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    started, other_up, go = tmp_path / "started", tmp_path / "other-up", tmp_path / "go"

    def loop(config: dict) -> None:
        import time
        from pathlib import Path

        Path(config["started"]).touch()
        deadline = time.monotonic() + 240
        while not Path(config["go"]).exists() and time.monotonic() < deadline:
            time.sleep(0.2)

    other = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import pathlib, time
        from ray.cluster_utils import Cluster
        while not pathlib.Path({str(started)!r}).exists():
            time.sleep(0.2)
        cluster = Cluster(initialize_head=True, head_node_args={{"num_cpus": 1}})
        pathlib.Path({str(other_up)!r}).touch()
        time.sleep(8)
        cluster.shutdown()
        pathlib.Path({str(go)!r}).touch()
    """)], env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    try:
        TorchTrainer(loop, train_loop_config={"started": str(started), "go": str(go)},
                     scaling_config=ScalingConfig(num_workers=1, resources_per_worker={"CPU": 1}),
                     run_config=RunConfig(storage_path=str(tmp_path / "runs"), name="beside")).fit()
        _, err = other.communicate(timeout=120)
        assert other.returncode == 0, err[-3000:]
        assert other_up.exists()  # the other cluster did run while the run was live
    finally:
        other.kill()
