"""The shared buffer actor: idempotent pushes, snapshots that wait for a step, restore; rank replicas ≡ LogitBuffer ≡ actor;
a killed actor comes back empty and refuses work until restored."""

import time

import numpy as np
import pytest
import ray
import torch

from ncdlr.buffer import LogitBuffer
from ncdlr.service.buffer_actor import BufferClient, BufferLostError, get_or_create_buffer_actor

pytestmark = pytest.mark.usefixtures("ray_local")


def test_push_is_applied_once_per_step_and_snapshot_sees_it():
    actor = get_or_create_buffer_actor("test-idempotent", capacity=8, num_clusters=3)
    rows = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert ray.get(actor.push.remote(0, rows)) == 0
    assert ray.get(actor.push.remote(0, rows + 100)) == 0  # a retried push of step 0 is ignored
    step, state = ray.get(actor.snapshot.remote(0))
    reference = LogitBuffer(8, 3)
    reference.push(torch.from_numpy(rows))
    assert step == 0 and torch.equal(state["rows"], reference.rows)
    ray.kill(actor)


def test_snapshot_waits_until_the_step_is_pushed():
    actor = get_or_create_buffer_actor("test-wait", capacity=4, num_clusters=2)
    pending = actor.snapshot.remote(1)
    ready, _ = ray.wait([pending], timeout=0.3)
    assert not ready
    actor.push.remote(0, np.ones((2, 2), np.float32))
    actor.push.remote(1, np.zeros((2, 2), np.float32))
    step, state = ray.get(pending, timeout=60)  # a bound against a hang, not a timing check (10 s timed out once on a loaded 2-core machine)
    assert step == 1 and state["rows"][-2:].sum() == 0
    ray.kill(actor)


def test_restore_resets_contents_and_step():
    actor = get_or_create_buffer_actor("test-restore", capacity=4, num_clusters=2)
    actor.push.remote(0, np.ones((2, 2), np.float32))
    saved = LogitBuffer(4, 2)
    saved.push(torch.full((4, 2), 7.0))
    assert ray.get(actor.restore.remote(5, saved.state_dict())) == 5
    step, state = ray.get(actor.snapshot.remote(5))
    assert step == 5 and torch.equal(state["rows"], saved.rows)
    ray.get(actor.restore.remote(-1, None))
    assert ray.get(actor.ping.remote()) == -1
    ray.kill(actor)


def test_two_clients_see_exactly_the_single_process_buffer():
    """Rank 0 and rank 1 replicas over 5 steps return what one LogitBuffer.push returns."""
    actor = get_or_create_buffer_actor("test-clients", capacity=10, num_clusters=3)
    clients = [BufferClient(actor, 10, 3, rank) for rank in range(2)]
    for client in clients:
        client.start(-1)
    reference = LogitBuffer(10, 3)
    gen = torch.Generator().manual_seed(0)
    for step in range(5):
        rows = torch.randn(4, 3, generator=gen)
        expected = reference.push(rows)
        for client in clients:
            assert torch.equal(client.history_plus(step, rows), expected)
        for client in clients:
            client.commit(step, rows)
    clients[0].flush()
    step, state = ray.get(actor.snapshot.remote(4))
    assert step == 4 and torch.equal(state["rows"], reference.rows)
    assert clients[0].times.steps == 5 and clients[1].times.steps == 0  # only rank 0 talks to the actor
    ray.kill(actor)


def test_after_n_steps_the_actor_equals_every_rank_replica():
    """12 steps of pushes that wrap the FIFO: the actor (after flush) holds exactly each rank's replica."""
    actor = get_or_create_buffer_actor("test-replicas", capacity=16, num_clusters=4)
    clients = [BufferClient(actor, 16, 4, rank) for rank in range(3)]
    for client in clients:
        client.start(-1)
    gen = torch.Generator().manual_seed(1)
    for step in range(12):
        rows = torch.randn(6, 4, generator=gen)
        for client in clients:
            client.history_plus(step, rows)
            client.commit(step, rows)
    clients[0].flush()
    step, state = ray.get(actor.snapshot.remote(11))
    assert step == 11
    for client in clients:
        assert torch.equal(client.state_dict()["rows"], state["rows"])
    ray.kill(actor)


def test_a_restarted_rank_loads_the_history_from_the_actor():
    """After a restore (checkpoint or worker restart) a fresh replica starts from the actor's contents."""
    actor = get_or_create_buffer_actor("test-reload", capacity=8, num_clusters=2)
    saved = LogitBuffer(8, 2)
    saved.push(torch.arange(16, dtype=torch.float32).view(8, 2))
    ray.get(actor.restore.remote(3, saved.state_dict()))
    client = BufferClient(actor, 8, 2, rank=1)
    client.start(3)
    rows = torch.ones(2, 2)
    assert torch.equal(client.history_plus(4, rows), saved.push(rows))
    ray.kill(actor)


def test_a_replica_refuses_a_step_out_of_order_or_before_start():
    actor = get_or_create_buffer_actor("test-order", capacity=4, num_clusters=2)
    client = BufferClient(actor, 4, 2, rank=0)
    with pytest.raises(RuntimeError, match="start"):
        client.history_plus(0, torch.ones(2, 2))
    client.start(-1)
    with pytest.raises(RuntimeError, match="replica is at step -1, got step 1"):
        client.history_plus(1, torch.ones(2, 2))
    ray.get(actor.restore.remote(3, None))
    with pytest.raises(RuntimeError, match="actor is at step 3, rank 0 expected 1"):
        client.start(1)
    ray.kill(actor)


@pytest.mark.parametrize("push_every", [1, 5])
def test_batched_pushes_leave_the_actor_equal_to_the_replica(push_every):
    """Rows delivered every ``push_every`` steps (from the first, fill-by-repetition push to a wrapped FIFO)
    are applied one step at a time: after ``flush`` the actor equals the replica, also mid-batch."""
    actor = get_or_create_buffer_actor(f"test-batched-{push_every}", capacity=10, num_clusters=3)
    client = BufferClient(actor, 10, 3, rank=0, push_every=push_every)
    client.start(-1)
    gen = torch.Generator().manual_seed(2)
    for step in range(13):
        rows = torch.randn(3 if step % 2 else 4, 3, generator=gen)
        client.history_plus(step, rows)
        client.commit(step, rows)
        if step == 6:  # a checkpoint in the middle of a batch
            client.flush()
            assert ray.get(actor.snapshot.remote(6))[0] == 6
    client.flush()
    step, state = ray.get(actor.snapshot.remote(12))
    assert step == 12
    assert torch.equal(state["rows"], client.state_dict()["rows"])
    assert ray.get(actor.push.remote(12, [np.zeros((3, 3), np.float32)] * 2)) == 12  # a retried batch: ignored
    assert torch.equal(ray.get(actor.snapshot.remote(12))[1]["rows"], client.state_dict()["rows"])
    client.close()
    ray.kill(actor)


def test_push_every_must_be_positive():
    with pytest.raises(ValueError, match="push_every"):
        BufferClient(None, 4, 2, rank=0, push_every=0)


def wait_until_restarted(actor, timeout_s: float = 60.0) -> None:
    """``ray.kill`` is asynchronous: calls may still reach the dying process, or fail with ``ActorUnavailableError``
    while Ray restarts it. Wait until the new, empty process (``step`` -1) answers."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if ray.get(actor.ping.remote(), timeout=timeout_s) == -1:
                return
        except ray.exceptions.RayActorError:
            pass
        time.sleep(0.1)
    raise TimeoutError("the killed buffer actor was not restarted")


def test_a_killed_actor_comes_back_under_its_name_lost_until_restored():
    """Ray restarts the actor (max_restarts) empty: it refuses pushes and snapshots, so nobody trains on or
    checkpoints a lost buffer, until ``restore`` (rank 0 after a worker-group restart) revives it."""
    actor = get_or_create_buffer_actor("test-killed", capacity=4, num_clusters=2)
    ray.get(actor.push.remote(0, np.ones((2, 2), np.float32)))
    ray.kill(actor, no_restart=False)
    revived = ray.get_actor("test-killed", namespace="ncdlr")
    wait_until_restarted(revived)
    with pytest.raises(BufferLostError, match="restarted"):
        ray.get(revived.snapshot.remote(0), timeout=60)
    with pytest.raises(BufferLostError):
        ray.get(revived.push.remote(1, np.ones((2, 2), np.float32)), timeout=60)
    saved = LogitBuffer(4, 2)
    saved.push(torch.full((2, 2), 3.0))
    assert ray.get(revived.restore.remote(0, saved.state_dict())) == 0
    assert ray.get(revived.push.remote(1, np.ones((2, 2), np.float32))) == 1
    ray.kill(revived)


def test_a_client_whose_actor_died_fails_its_next_flush_instead_of_hanging():
    """Rank 0's pushes to a dead actor surface as an error of the training step (then the worker group restarts)."""
    actor = get_or_create_buffer_actor("test-client-killed", capacity=8, num_clusters=2)
    client = BufferClient(actor, 8, 2, rank=0, push_every=2)
    client.start(-1)
    for step in range(3):
        client.history_plus(step, torch.ones(2, 2))
        client.commit(step, torch.ones(2, 2))
    ray.kill(actor, no_restart=False)
    with pytest.raises(Exception) as failure:  # ActorUnavailableError for a push in flight, else BufferLostError
        for step in range(3, 9):
            client.history_plus(step, torch.ones(2, 2))
            client.commit(step, torch.ones(2, 2))
        client.flush()
    assert isinstance(failure.value, (ray.exceptions.RayActorError, BufferLostError))
    client.close(flush=False)
    ray.kill(actor)
