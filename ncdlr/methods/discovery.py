"""The discovery step: pseudo-labels for a gathered batch plus the shared buffer (method.md §4.1, §4.7).

One step on rank ``r`` of ``W``: every rank's novel logits ``S_v = z_v P^u`` (both views, ``[2, B, Ku]``) are
gathered and ordered ``[view 1 of rank 0..W-1; view 2 of rank 0..W-1]`` — exactly the rows a single process
would have on the concatenated batch; invalid (undecodable or padded) rows are dropped by a gathered mask.
The buffer gives ``[history; gathered rows]`` — identical on all ranks, since all push the same rows — and every
rank runs the same labeler on it, so ``t``/``τ`` stay identical; each rank keeps the labels of its own rows.

The all-gather is injected (``gather``): :func:`single_process` here, ``torch.distributed`` in the service, so
this module runs in a notebook on tensors and knows nothing of Ray.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from ncdlr.buffer import SharedBuffer
from ncdlr.labeler import AdaptiveSelfLabeler

Gather = Callable[[Tensor], Tensor]
"""``[n, ...]`` on this rank → ``[W, n, ...]`` in rank order (a collective: every rank calls it)."""


def single_process(local: Tensor) -> Tensor:
    """The :data:`Gather` of one process: ``[n, ...]`` → ``[1, n, ...]``."""
    return local.unsqueeze(0)


def buffer_width(num_novel: int, heads: int = 1) -> int:
    """Columns of a buffer row: each of the ``heads`` heads' ``num_novel`` (Ku) novel logits side by side
    (:class:`Discovery`'s layout)."""
    return num_novel * heads


def _settle(device: torch.device) -> None:
    """Wait for queued GPU work, so that the phase timers measure their own phase (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Discovery:
    """Soft pseudo-labels of this rank's novel rows, solved on the global problem.

    Args:
        labelers: the (stateful) self-labeler every rank runs on the same problem, or one per head: with ``H``
            labelers the scores hold ``H`` heads side by side (``[V, B, H·Ku]``, head h in columns
            ``h·Ku .. (h+1)·Ku - 1``; the buffer rows too), and labeler h solves its head's columns alone.
        buffer: the shared history (None → buffer off: solve on the gathered batch only).
        gather: the all-gather of the ranks (:func:`single_process` when alone).
        rank: this rank's index in the gathered order.
        sizes: also record :attr:`last_sizes`, the clusters' sizes in each solve (``method.novel_reweight``); the
            labeler then returns the labels of every row of the problem (one more ``[N, Ku]`` pass), not only the
            batch's, and the batch's labels are the same.
    """

    def __init__(self, labelers: AdaptiveSelfLabeler | Sequence[AdaptiveSelfLabeler], buffer: SharedBuffer | None = None,
                 gather: Gather = single_process, rank: int = 0, sizes: bool = False):
        self.labelers = [labelers] if isinstance(labelers, AdaptiveSelfLabeler) else list(labelers)
        if not self.labelers:
            raise ValueError("discovery needs at least one labeler")
        self.buffer = buffer
        self.gather = gather
        self.rank = rank
        self.sizes = sizes
        #: ``[H·Ku]`` rows per cluster (column sums of the soft labels) over the last solve's whole problem (history +
        #: gathered rows; identical on every rank), when ``sizes`` is on; None before the first call
        self.last_sizes: Tensor | None = None

    @property
    def labeler(self) -> AdaptiveSelfLabeler:
        """Head 0's labeler."""
        return self.labelers[0]

    def _solve(self, problem: Tensor, last: int) -> Tensor:
        """Each head's labeler on its columns of ``problem [N, H·Ku]`` → ``[last, H·Ku]`` labels."""
        if len(self.labelers) == 1:
            return self.labeler(problem, last=last)
        parts = [part.contiguous() for part in problem.chunk(len(self.labelers), dim=1)]
        return torch.cat([labeler(part, last=last) for labeler, part in zip(self.labelers, parts)], dim=1)

    def __call__(self, novel_scores: Tensor, valid: Tensor, step: int) -> tuple[Tensor, dict[str, float]]:
        """Pseudo-labels for ``novel_scores [V, B, Ku]`` (detached logits of this rank's ``V`` views; ``[V, B, H·Ku]``
        with ``H`` labelers).

        Args:
            valid: ``[B]`` bool, decodable novel rows.
            step: the global training step (the buffer's clock).

        Returns:
            ``[V, B, Ku]`` soft labels (``[V, B, H·Ku]``: each head's rows sum to 1; rows of invalid images are zeros), and phase times in
            seconds ``{"exchange": gather + buffer, "ot": labeler call}``.
        """
        views, b, ku = novel_scores.shape
        _settle(novel_scores.device)  # the forward pass is compute, not exchange: let it finish before timing
        t0 = time.perf_counter()
        mask = valid.to(novel_scores.device).float()[None, :, None].expand(views, b, 1)
        packed = torch.cat([novel_scores.float(), mask], dim=2)
        gathered = self.gather(packed)  # [W, V, B, Ku+1]
        world = gathered.shape[0]
        rows = gathered.transpose(0, 1).reshape(views * world * b, ku + 1)  # [view1 of all ranks; view2 ...]
        keep = rows[:, ku] > 0.5
        new_rows = rows[keep, :ku]  # stays on the device, like the buffer replica
        problem = self.buffer.history_plus(step, new_rows) if self.buffer is not None else new_rows
        _settle(novel_scores.device)
        t1 = time.perf_counter()
        if self.sizes:
            labels = self._solve(problem.to(novel_scores.device), last=None)
            self.last_sizes = labels.sum(0)
            labels = labels[labels.shape[0] - new_rows.shape[0]:]
        else:
            labels = self._solve(problem.to(novel_scores.device), last=new_rows.shape[0])
        t2 = time.perf_counter()
        if self.buffer is not None:
            self.buffer.commit(step, new_rows)
        position = torch.full((rows.shape[0],), -1, dtype=torch.long)
        position[keep.cpu()] = torch.arange(new_rows.shape[0])
        mine = position.view(views, world, b)[:, self.rank]  # [V, B]
        out = torch.zeros(views, b, ku, device=labels.device)
        ok = mine >= 0
        out[ok] = labels[mine[ok].to(labels.device)]
        t3 = time.perf_counter()
        return out, {"exchange": (t1 - t0) + (t3 - t2), "ot": t2 - t1}
