"""``init_ray``: a local Ray is always a new one, and a start-up that times out on a loaded machine is tried again.

A ``ray.cluster_utils.Cluster`` in another test worker writes ``/tmp/ray/ray_current_cluster``; ``ray.init``
without an address then tries to join it and refuses ``num_cpus`` (CI, session 18). Ray's raylet also gives up
after a fixed 30 s when the machine is busy (``cluster/simulate.py`` retries for that). A real overload cannot be
produced on demand, so the retry tests make ``ray.init`` raise Ray's own start-up error: three replace ``ray.init``,
``ray.shutdown`` and ``ray.is_initialized`` entirely (no shared Ray of this test process is touched); one lets the
second call start a real local Ray in a fresh process. The last runs a real ``cluster_utils`` cluster beside
``init_ray``, in a fresh process with its own Ray temp directory (``RAY_TMPDIR``) so that its address file does
not reach the other test worker.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from ncdlr.service import entry

STARTUP_TIMEOUT = ("The current node timed out during startup. This could happen because some of the raylet "
                   "failed to startup or the GCS has become overloaded.")


@pytest.fixture
def fake_ray(monkeypatch):
    """``ray.init`` records its keyword arguments and raises what ``fake_ray.errors`` holds, in order."""
    import ray

    class Fake:
        calls: list[dict] = []
        errors: list[BaseException] = []
        shutdowns = 0

    def init(**kwargs):
        Fake.calls.append(kwargs)
        if Fake.errors:
            raise Fake.errors.pop(0)

    def shutdown():
        Fake.shutdowns += 1

    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "shutdown", shutdown)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    return Fake


def test_a_local_start_always_asks_for_a_new_local_ray(fake_ray):
    """``address="local"``: a cluster that ``ray start`` left on the machine is never joined by accident (Ray's
    ``address=None`` would read it from ``/tmp/ray/ray_current_cluster`` and then refuse ``num_cpus``)."""
    assert entry.init_ray(cpus_needed=3) is True
    assert len(fake_ray.calls) == 1 and fake_ray.calls[0]["address"] == "local"
    assert fake_ray.calls[0]["num_cpus"] >= 4


def test_a_start_up_timeout_is_tried_once_more_and_then_raised(fake_ray, capsys):
    fake_ray.errors = [Exception(STARTUP_TIMEOUT), Exception(STARTUP_TIMEOUT)]
    with pytest.raises(Exception, match="timed out during startup"):
        entry.init_ray()
    assert len(fake_ray.calls) == entry.LOCAL_START_ATTEMPTS == 2 and fake_ray.shutdowns == 1
    assert "Ray's local start timed out" in capsys.readouterr().err


def test_other_start_errors_are_not_retried(fake_ray):
    fake_ray.errors = [ValueError("object_store_memory is larger than the machine")]
    with pytest.raises(ValueError, match="object_store_memory"):
        entry.init_ray(object_store_bytes=10**15)
    assert len(fake_ray.calls) == 1 and fake_ray.shutdowns == 0


def run_script(script: Path) -> subprocess.CompletedProcess:
    """``script`` in a fresh Python with this checkout importable, no ``RAY_ADDRESS`` and a private Ray temp
    directory (short: Ray's socket paths live under it), removed afterwards."""
    ray_tmp = tempfile.mkdtemp(prefix="ncdlr-ray-", dir="/tmp")
    env = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}
    env.update(PYTHONPATH=str(Path(__file__).resolve().parents[2]), RAY_USAGE_STATS_ENABLED="0", RAY_TMPDIR=ray_tmp)
    try:
        return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)


def test_after_one_timed_out_start_the_second_starts_a_real_local_ray(tmp_path):
    """In a fresh process: the first ``ray.init`` raises Ray's start-up timeout, the second is Ray's own."""
    script = tmp_path / "start.py"
    script.write_text(f"""
import ray
from ncdlr.service import entry
real, calls = ray.init, []
def init(**kwargs):
    calls.append(kwargs)
    if len(calls) == 1:
        raise Exception({STARTUP_TIMEOUT!r})
    return real(**kwargs)
ray.init = init
assert entry.init_ray(cpus_needed=2) is True
assert ray.is_initialized() and len(calls) == 2
print("CPUS", ray.cluster_resources()["CPU"])
ray.shutdown()
""")
    done = run_script(script)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "trying again (2/2)" in done.stderr
    assert float(done.stdout.split("CPUS")[1]) >= 4


def test_a_cluster_that_cluster_utils_left_on_the_machine_is_not_joined(tmp_path):
    """In a fresh process: a live ``ray.cluster_utils.Cluster`` writes ``/tmp/ray/ray_current_cluster``; Ray's own
    ``ray.init(num_cpus=...)`` then refuses, ``init_ray`` starts its own local Ray beside it."""
    script = tmp_path / "beside.py"
    script.write_text("""
import ray
from ray.cluster_utils import Cluster
from ncdlr.service import entry
cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
try:
    try:
        ray.init(num_cpus=2)
        print("RAY_JOINED")
    except ValueError as err:
        print("RAY_REFUSED", err)
    assert entry.init_ray(cpus_needed=2) is True
    own = ray.get_runtime_context().gcs_address
    print("OWN", own != cluster.address, ray.cluster_resources()["CPU"])
    ray.shutdown()
finally:
    cluster.shutdown()
""")
    done = run_script(script)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "RAY_REFUSED When connecting to an existing cluster" in done.stdout  # what the fix is for
    own = done.stdout.split("OWN")[1].split()
    assert own[0] == "True" and float(own[1]) >= 4


def test_the_worker_setup_reaches_every_worker_and_a_set_idle_wait_travels_with_the_job():
    """``with_worker_setup`` (run in a child: it patches the process it runs in) adds the worker setup hook, keeps a
    hook and variables the caller set, and sends an idle wait set in the driver's environment along (a cluster's
    workers do not inherit it); with the wait off the hook stays (Ray Train's cleaner still needs it)."""
    code = (
        "import json; from ncdlr.service import entry\n"
        "print(json.dumps([entry.with_worker_setup(None), "
        "entry.with_worker_setup({'env_vars': {'A': '1'}, 'worker_process_setup_hook': 'x.y'})]))"
    )

    def run(**env):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             env={**os.environ, **env}).stdout
        return out.strip().splitlines()[-1]

    import json

    worker_setup_hook = "ncdlr.service.worker_setup.setup_worker"
    default, kept = json.loads(run())
    assert default == {"worker_process_setup_hook": worker_setup_hook}
    assert kept == {"env_vars": {"A": "1"}, "worker_process_setup_hook": "x.y"}
    default, kept = json.loads(run(NCDLR_RAY_DATA_IDLE_WAIT_S="0.05"))
    assert default["env_vars"] == {"NCDLR_RAY_DATA_IDLE_WAIT_S": "0.05"}
    assert kept["env_vars"] == {"NCDLR_RAY_DATA_IDLE_WAIT_S": "0.05", "A": "1"}
    assert json.loads(run(NCDLR_RAY_DATA_IDLE_WAIT_S="0")) == [
        {"env_vars": {"NCDLR_RAY_DATA_IDLE_WAIT_S": "0"}, "worker_process_setup_hook": worker_setup_hook},
        {"env_vars": {"NCDLR_RAY_DATA_IDLE_WAIT_S": "0", "A": "1"}, "worker_process_setup_hook": "x.y"}]
