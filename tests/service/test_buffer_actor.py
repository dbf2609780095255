"""The shared buffer actor: idempotent pushes, snapshots that wait for a step, restore; client ≡ LogitBuffer."""

import numpy as np
import pytest
import ray
import torch

from ncdlr.buffer import LogitBuffer
from ncdlr.service.buffer_actor import BufferClient, get_or_create_buffer_actor

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
    step, state = ray.get(pending, timeout=10)
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
    """Rank 0 and rank 1 clients over 5 steps return what one LogitBuffer.push returns."""
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
    step, state = ray.get(actor.snapshot.remote(4))
    assert torch.equal(state["rows"], reference.rows)
    assert all(c.times.steps == 5 and c.times.wait >= 0 for c in clients)
    ray.kill(actor)
