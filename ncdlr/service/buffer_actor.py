"""The shared buffer of novel logits as a named Ray actor (method.md §4.1 and §4.7).

Every DDP rank solves the same OT problem ``[history; gathered current rows]``. The history is the
global FIFO of the last ``J`` rows, held by one :class:`BufferActor` (a :class:`ncdlr.buffer.LogitBuffer`
inside), so it outlives worker restarts and is saved in checkpoints.

Exchange per training step ``s`` (see :class:`BufferClient`), designed so no rank waits on the actor
inside the step:

1. Before step ``s`` each rank already holds ``ref_s = actor.snapshot.remote(after_step=s - 1)``, issued at
   the end of step ``s - 1``; Ray fetched it while the rank ran data loading, forward and backward.
2. In step ``s`` the rank ``ray.get``s that snapshot (normally already local), loads it into a local
   ``LogitBuffer`` mirror and pushes the gathered rows there → the exact buffer the actor will hold.
3. Rank 0 sends ``actor.push.remote(s, rows)`` (fire-and-forget; the actor ignores a step it has already
   applied, so a retried push is harmless); every rank then issues ``snapshot(after_step=s)`` for the next
   step. ``snapshot`` is async and waits until step ``s`` is applied, so ranks other than 0 never read a
   stale buffer.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import numpy as np
import ray
import torch

from ncdlr.buffer import LogitBuffer


@ray.remote(num_cpus=0)
class BufferActor:
    """Global FIFO of novel logits ``[J, Ku]`` (float32). ``step`` = index of the last applied push."""

    def __init__(self, capacity: int, num_clusters: int):
        self._shape = (capacity, num_clusters)
        self._buffer = LogitBuffer(capacity, num_clusters)
        self._step = -1
        self._changed = asyncio.Condition()

    async def push(self, step: int, rows: np.ndarray) -> int:
        """Append ``rows [n, Ku]`` as training step ``step``; a step ≤ the last applied one is ignored."""
        async with self._changed:
            if step > self._step:
                self._buffer.push(torch.as_tensor(np.asarray(rows, dtype=np.float32)))
                self._step = step
                self._changed.notify_all()
            return self._step

    async def snapshot(self, after_step: int) -> tuple[int, dict]:
        """``(step, LogitBuffer.state_dict())`` once push ``after_step`` has been applied."""
        async with self._changed:
            await self._changed.wait_for(lambda: self._step >= after_step)
            return self._step, self._buffer.state_dict()

    async def restore(self, step: int, state: dict | None) -> int:
        """Reset to a checkpointed ``state`` (or empty when None) at ``step``; used on (re)start and resume."""
        async with self._changed:
            self._buffer = LogitBuffer(*self._shape)
            if state is not None:
                self._buffer.load_state_dict(state)
            self._step = step
            self._changed.notify_all()
            return self._step

    def ping(self) -> int:
        return self._step


def get_or_create_buffer_actor(name: str, capacity: int, num_clusters: int, namespace: str = "ncdlr"):
    """The named actor ``name`` (created if absent). Lives as long as the driver that created it."""
    return BufferActor.options(name=name, namespace=namespace, get_if_exists=True,
                               max_concurrency=64).remote(capacity, num_clusters)


@dataclass
class ExchangeTimes:
    """Seconds spent waiting on the actor (``wait``) and issuing calls (``issue``), summed over steps."""

    wait: float = 0.0
    issue: float = 0.0
    steps: int = 0
    samples: list[float] = field(default_factory=list)


class BufferClient:
    """A rank's view of the shared buffer: local mirror + prefetched snapshot from the actor.

    ``history_plus(step, rows)`` returns the buffer after appending this step's gathered ``rows``;
    ``commit(step, rows)`` hands the rows to the actor (rank 0) and prefetches the next snapshot.
    """

    def __init__(self, actor, capacity: int, num_clusters: int, rank: int):
        self.actor = actor
        self.rank = rank
        self._shape = (capacity, num_clusters)
        self.local = LogitBuffer(capacity, num_clusters)
        self._pending = None
        self._local_step = -1
        self.times = ExchangeTimes()

    def start(self, step: int) -> None:
        """Prefetch the actor's state as of ``step`` (the last applied push) before the first train step."""
        self._pending = self.actor.snapshot.remote(step)

    def history_plus(self, step: int, rows: torch.Tensor) -> torch.Tensor:
        """``[J, Ku]`` buffer after pushing ``rows [n, Ku]`` for ``step`` (identical on every rank)."""
        t0 = time.perf_counter()
        if self._pending is not None:
            snap_step, state = ray.get(self._pending)
            self._pending = None
            if snap_step != step - 1:
                raise RuntimeError(f"buffer actor is at step {snap_step}, rank {self.rank} expected {step - 1}")
            if snap_step >= 0:
                self.local.load_state_dict(state)
            else:
                self.local = LogitBuffer(*self._shape)
        self.times.wait += time.perf_counter() - t0
        self._local_step = step
        return self.local.push(rows.detach().float().cpu())

    def commit(self, step: int, rows: torch.Tensor) -> None:
        """Rank 0 appends ``rows`` to the actor; every rank prefetches the snapshot for ``step + 1``."""
        t0 = time.perf_counter()
        if self.rank == 0:
            self.actor.push.remote(step, rows.detach().float().cpu().numpy())
        self._pending = self.actor.snapshot.remote(step)
        self.times.issue += time.perf_counter() - t0
        self.times.steps += 1
