"""The shared buffer of novel logits as a named Ray actor (method.md §4.1 and §4.7).

Every DDP rank solves the same OT problem ``[history; gathered current rows]``. The history is the
global FIFO of the last ``J`` rows. It is identical on every rank by construction (every rank pushes the
same gathered rows in the same order), so each rank keeps its own replica — a local
:class:`ncdlr.buffer.LogitBuffer` — and the step never reads the actor. One :class:`BufferActor` holds
the same FIFO as the shared source of truth: it outlives worker restarts, and checkpoints save its contents.

Exchange per training step ``s`` (see :class:`BufferClient`):

1. Every rank pushes the gathered rows of step ``s`` into its local replica → the OT problem (no Ray call).
2. Rank 0 collects the rows of ``push_every`` consecutive steps (default 8) and hands them, as one list,
   to a background sender thread, which waits until the actor has applied the previous push and then sends
   ``actor.push.remote(s, [rows of steps s-7 .. s])`` fire-and-forget; the actor applies them one step at a
   time, so its FIFO is exactly the replicas'. The actor's contents are read only after a :meth:`flush`
   (checkpoints) and on restore, so delivering them in batches loses nothing, and it keeps the sender
   thread's Python work (serialising ≈ 100 KB per step into the object store at n = 256, Ku = 100, the
   remote call) from competing with the training step for the GIL every step. The step itself only waits if
   the previous hand-off has not been sent yet, so at most one push is in flight plus one hand-off, and the
   actor receives the pushes in step order. The actor ignores a step it has already applied, so a retried
   push is harmless.
3. Ranks load the history from the actor only at start and after a restore/worker restart
   (:meth:`BufferClient.start`); :meth:`BufferClient.flush` waits for the last push (before a checkpoint).

A dead actor is survived: Ray restarts it (``max_restarts=-1``) under the same name, empty and marked lost,
and a lost actor refuses every push and snapshot (:class:`BufferLostError`) until it is restored. So rank 0's
next hand-off or flush fails (a push in flight when the actor died fails with Ray's ``ActorDiedError``), the
worker group fails, Ray Train restarts it from the last checkpoint (``run.max_failures`` ≥ 1), and rank 0
restores the actor from that checkpoint's buffer (:func:`ncdlr.service.worker.connect`) — nothing waits on
a step the restarted actor will never reach.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import ray
import torch

from ncdlr.buffer import LogitBuffer


class BufferLostError(RuntimeError):
    """The buffer actor was restarted after it died: its contents are gone until a checkpoint restores them."""


@ray.remote(num_cpus=0)
class BufferActor:
    """Global FIFO of novel logits ``[J, Ku]`` (float32). ``step`` = index of the last applied push."""

    def __init__(self, capacity: int, num_clusters: int):
        self._shape = (capacity, num_clusters)
        self._buffer = LogitBuffer(capacity, num_clusters)
        self._step = -1
        self._changed = asyncio.Condition()
        self._lost = ray.get_runtime_context().was_current_actor_reconstructed  # restarted by Ray: empty

    def _refuse_if_lost(self) -> None:
        if self._lost:
            raise BufferLostError("the buffer actor was restarted and lost its contents; restore it from the last "
                                  "checkpoint (a worker-group restart does)")

    async def push(self, step: int, rows: np.ndarray | list[np.ndarray]) -> int:
        """Append ``rows [n, Ku]`` as training step ``step``, or a list of ``m`` such arrays as steps
        ``step - m + 1 .. step`` (oldest first), one push per step; steps ≤ the last applied one are ignored."""
        self._refuse_if_lost()
        parts = rows if isinstance(rows, list) else [rows]
        async with self._changed:
            for part_step, part in enumerate(parts, start=step - len(parts) + 1):
                if part_step > self._step:
                    self._buffer.push(torch.as_tensor(np.asarray(part, dtype=np.float32)))
                    self._step = part_step
            self._changed.notify_all()
            return self._step

    async def snapshot(self, after_step: int) -> tuple[int, dict]:
        """``(step, LogitBuffer.state_dict())`` once push ``after_step`` has been applied."""
        self._refuse_if_lost()
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
            self._lost = False
            self._changed.notify_all()
            return self._step

    def ping(self) -> int:
        return self._step


def get_or_create_buffer_actor(name: str, capacity: int, num_clusters: int, namespace: str = "ncdlr"):
    """The named actor ``name`` (created if absent). Lives as long as the driver that created it; Ray restarts it
    under the same name, empty and lost (see :class:`BufferLostError`), whenever it dies."""
    return BufferActor.options(name=name, namespace=namespace, get_if_exists=True, max_concurrency=64,
                               max_restarts=-1).remote(capacity, num_clusters)


@dataclass
class ExchangeTimes:
    """Seconds rank 0's step waited for the previous hand-off (``wait``) and spent handing rows off (``issue``)."""

    wait: float = 0.0
    issue: float = 0.0
    steps: int = 0


class BufferClient:
    """A rank's replica of the shared buffer, kept in step with the :class:`BufferActor`.

    ``start(step)`` loads the actor's history (once, before training); ``history_plus(step, rows)`` returns
    the replica after appending this step's gathered ``rows``; ``commit(step, rows)`` queues the rows for the
    actor (rank 0 only; sent every ``push_every`` steps on a sender thread); ``flush()`` sends what is queued
    and waits until the actor has applied it.
    """

    def __init__(self, actor, capacity: int, num_clusters: int, rank: int, device: torch.device | str | None = None,
                 push_every: int = 8):
        if push_every < 1:
            raise ValueError(f"push_every must be >= 1, got {push_every}")
        self.actor = actor
        self.rank = rank
        self._shape = (capacity, num_clusters)
        self.device = device  # where the replica lives: the rank's training device (no host copies per step)
        self.local = LogitBuffer(capacity, num_clusters, device)
        self._step = None  # last step in the replica; None before ``start``
        self._sender = ThreadPoolExecutor(max_workers=1, thread_name_prefix="buffer-push") if rank == 0 else None
        self.push_every = push_every
        self._queued: list[np.ndarray] = []  # rank 0: rows of the steps not yet handed off, oldest first
        self._queued_step = -1  # the last step in ``_queued``
        self._handoff: Future | None = None  # rank 0's last hand-off to the sender thread
        self._in_flight = None  # ObjectRef of the last push sent (touched by the sender thread only)
        self.times = ExchangeTimes()

    def start(self, step: int) -> None:
        """Load the actor's buffer as of ``step`` (its last applied push; -1 = empty) into the replica."""
        snap_step, state = ray.get(self.actor.snapshot.remote(step))
        if snap_step != step:
            raise RuntimeError(f"buffer actor is at step {snap_step}, rank {self.rank} expected {step}")
        self.local = LogitBuffer(*self._shape, self.device)
        if snap_step >= 0:
            self.local.load_state_dict(state)
        self._step = step

    @property
    def step(self) -> int | None:
        """The last step pushed into the replica (None before :meth:`start`)."""
        return self._step

    def history_plus(self, step: int, rows: torch.Tensor) -> torch.Tensor:
        """``[max(J, n), Ku]`` replica after pushing ``rows [n, Ku]`` for ``step`` (identical on every rank)."""
        if self._step is None:
            raise RuntimeError("BufferClient.start() must load the actor's history before the first step")
        if step != self._step + 1:
            raise RuntimeError(f"rank {self.rank}: buffer replica is at step {self._step}, got step {step}")
        self._step = step
        return self.local.push(rows)  # LogitBuffer.push detaches and copies to float32 on its device

    def commit(self, step: int, rows: torch.Tensor) -> None:
        """Rank 0 queues ``rows [n, Ku]`` of ``step`` and hands the queue to the sender thread every
        ``push_every`` steps (other ranks: nothing to do)."""
        if self._sender is None:
            return
        t0 = time.perf_counter()
        self._queued.append(rows.detach().float().cpu().numpy().copy())
        self._queued_step = step
        self.times.issue += time.perf_counter() - t0
        self.times.steps += 1
        if len(self._queued) >= self.push_every:
            self._hand_off()

    def _hand_off(self) -> None:
        """Give the queued steps to the sender thread once the previous hand-off was sent (``times.wait``)."""
        t0 = time.perf_counter()
        if self._handoff is not None:
            self._handoff.result()  # previous push sent (re-raises a failed send)
        t1 = time.perf_counter()
        queued, self._queued = self._queued, []
        self._handoff = self._sender.submit(self._send, self._queued_step, queued)
        self.times.wait += t1 - t0
        self.times.issue += time.perf_counter() - t1

    def _send(self, step: int, rows: list[np.ndarray]) -> None:
        """Sender thread: wait for the previous push to be applied, then push the steps ending at ``step``."""
        if self._in_flight is not None:
            ray.get(self._in_flight)
        self._in_flight = self.actor.push.remote(step, rows)

    def flush(self) -> None:
        """Send what is queued and block until the actor has applied it (no-op on other ranks / when idle)."""
        if self._queued:
            self._hand_off()
        if self._handoff is not None:
            self._handoff.result()
            self._handoff = None
        if self._in_flight is not None:
            ray.get(self._in_flight)
            self._in_flight = None

    def close(self, flush: bool = True) -> None:
        """Flush (unless ``flush=False``: after a failure the actor may be gone) and stop the sender thread."""
        if flush:
            self.flush()
        if self._sender is not None:
            self._sender.shutdown(wait=True)
            self._sender = None

    def state_dict(self) -> dict:
        """The replica's :meth:`LogitBuffer.state_dict` (equal to the actor's once :meth:`flush` returned)."""
        return self.local.state_dict()
