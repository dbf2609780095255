"""``ncdlr.data.idle_wait``: Ray Data's scheduling loop sleeps, instead of spinning, while none of its tasks runs
(or every running one is held in output back-pressure).

The first test drives the wrapper with stand-ins for the executor's operators (objects with ``get_active_tasks``):
the decision it makes is a pure function of that one call. The others patch Ray 2.60's real executor module, in a
fresh interpreter and in the workers of the tests' local Ray. What the wait saves is measured in
``benchmarks/bench_idle_wait.py``, not here.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from ncdlr.data import idle_wait


class _Op:
    def __init__(self, tasks: list, held: bool = False):
        self.tasks = tasks
        self._in_task_output_backpressure = held

    def get_active_tasks(self) -> list:
        return self.tasks


def test_the_step_sleeps_only_when_no_operator_has_a_task_in_flight() -> None:
    calls, slept = [], []
    step = idle_wait.waiting(lambda topology, *a, **k: calls.append((a, k)) or 7, 0.02, sleep=slept.append)
    idle = {_Op([]): "state", _Op([]): "state"}
    busy = {_Op([]): "state", _Op(["task"]): "state"}
    assert step(idle, "policies", max_errored_blocks=3) == 7 and slept == [0.02]
    assert step(busy, "policies", max_errored_blocks=3) == 7 and slept == [0.02]  # a task runs: ray.wait blocks
    assert calls == [(("policies",), {"max_errored_blocks": 3})] * 2  # the step itself always runs, unchanged
    assert step.__wrapped__(idle) == 7 and step.idle_wait_s == 0.02


def test_the_step_sleeps_when_every_running_operator_is_held_in_output_back_pressure() -> None:
    """Its tasks' outputs are ready (``ray.wait`` returns at once) and the step would not read them."""
    slept = []
    step = idle_wait.waiting(lambda topology: None, 0.02, sleep=slept.append)
    step({_Op(["task"], held=True): "s", _Op([], held=False): "s"})
    assert slept == [0.02]
    step({_Op(["task"], held=True): "s", _Op(["task"], held=False): "s"})  # one operator's tasks can still deliver
    assert slept == [0.02]
    import inspect

    from ray.data._internal.execution.interfaces.physical_operator import PhysicalOperator

    # Ray 2.60 (the pinned version) keeps the flag there: if an upgrade renames it, this fails
    assert "self._in_task_output_backpressure =" in inspect.getsource(PhysicalOperator.__init__)


def test_patch_wraps_once_and_refuses_what_it_cannot_patch() -> None:
    class Module:
        @staticmethod
        def process_completed_tasks(topology):
            return "done"

    original = Module.process_completed_tasks
    assert idle_wait.patch(Module, 0.01) and idle_wait.patch(Module, 0.05)
    assert Module.process_completed_tasks.__wrapped__ is original  # not wrapped twice
    assert Module.process_completed_tasks.idle_wait_s == 0.01
    assert not idle_wait.patch(type("Other", (), {}), 0.01)  # another Ray version: no such function
    assert not idle_wait.patch(Module, 0.0)


def _run(code: str, **env: str) -> str:
    import os

    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120,
                         env={**os.environ, **env})
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_install_patches_ray_datas_executor_when_it_is_first_imported() -> None:
    """Ray 2.60 (the pinned version) has the function the patch wraps: if an upgrade moves it, this fails."""
    out = _run("""
        import sys
        from ncdlr.data import idle_wait
        assert idle_wait.install()
        before = idle_wait.EXECUTOR_MODULE in sys.modules   # not imported by install itself
        import ray.data._internal.execution.streaming_executor as se
        from ray.data._internal.execution import streaming_executor_state as state
        print(before, idle_wait.installed(), se.process_completed_tasks.__wrapped__ is state.process_completed_tasks)
    """)
    assert out == "False 0.02 True"


def test_the_wait_follows_its_variable_and_zero_turns_it_off() -> None:
    code = """
        from ncdlr.data import idle_wait
        import ray.data._internal.execution.streaming_executor
        print(idle_wait.install(), idle_wait.installed())
    """
    assert _run(code, NCDLR_RAY_DATA_IDLE_WAIT_S="0.005") == "True 0.005"
    assert _run(code, NCDLR_RAY_DATA_IDLE_WAIT_S="0") == "False None"
    with pytest.raises(AssertionError, match="must be a number of seconds"):
        _run(code, NCDLR_RAY_DATA_IDLE_WAIT_S="soon")


@pytest.mark.slow
def test_every_worker_of_the_job_waits_and_a_split_stream_delivers_every_row(ray_local) -> None:
    """The tests' Ray is started as ``init_ray`` starts it: its workers (a ``SplitCoordinator`` is one) get the
    hook, and a two-way ``streaming_split`` read by two slow consumers delivers every row once."""
    import ray

    @ray.remote
    def executor_wait() -> float | None:
        import ray.data._internal.execution.streaming_executor  # noqa: F401

        return idle_wait.installed()

    assert ray.get(executor_wait.remote()) == idle_wait.DEFAULT_IDLE_WAIT_S

    @ray.remote
    def consume(shard) -> list[int]:
        import time

        rows = []
        for batch in shard.iter_batches(batch_size=8):
            time.sleep(0.05)  # a step slower than the reads: the executor has nothing in flight meanwhile
            rows += batch["id"].tolist()
        return rows

    shards = ray.data.range(96, override_num_blocks=6).streaming_split(2, equal=True)
    got = ray.get([consume.remote(shard) for shard in shards])
    assert sorted(got[0] + got[1]) == list(range(96)) and len(got[0]) == len(got[1]) == 48
