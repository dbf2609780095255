"""FIFO buffer of past novel logits for the OT step (method.md §4.1)."""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor


class LogitBuffer:
    """The last ``J`` rows of detached novel logits ``[J, K]``.

    Each training step pushes the current batch's rows and solves the OT problem over the returned
    matrix (history + current rows, current rows last); the last ``B`` rows of the solution are the
    batch's pseudo-labels. The first push fills the empty buffer by repeating the first batch.

    Rows live on ``device`` (default CPU): on a GPU worker the ``[J, K]`` history then never crosses the
    PCIe bus (≈ 8 MB per step at J = 2048, K = 1000). ``state_dict()`` always holds CPU tensors, so
    checkpoints load on any machine.
    """

    def __init__(self, capacity: int, num_clusters: int, device: torch.device | str | None = None) -> None:
        if capacity < 1 or num_clusters < 1:
            raise ValueError(f"capacity and num_clusters must be >= 1, got {capacity}, {num_clusters}")
        self.capacity = capacity
        self.num_clusters = num_clusters
        self.device = torch.device(device or "cpu")
        self._rows = torch.empty(0, num_clusters, device=self.device)

    def __len__(self) -> int:
        return self._rows.shape[0]

    @property
    def rows(self) -> Tensor:
        """``[len, K]`` stored rows, oldest first (read-only view)."""
        return self._rows

    def push(self, rows: Tensor) -> Tensor:
        """Append ``rows [B, K]``; return ``[max(J, B), K]`` = history then the new rows.

        With ``B >= J`` the result is just ``rows`` (the buffer then keeps their last ``J``).
        """
        if rows.ndim != 2 or rows.shape[1] != self.num_clusters:
            raise ValueError(f"expected rows [B, {self.num_clusters}], got {tuple(rows.shape)}")
        rows = rows.detach().to(device=self.device, dtype=torch.float32, copy=True)
        if len(self) == 0:
            repeats = -(-self.capacity // rows.shape[0])  # ceil
            history = rows.repeat(repeats, 1)
        else:
            history = self._rows
        if rows.shape[0] >= self.capacity:
            self._rows = rows[-self.capacity :].clone()
            return rows
        combined = torch.cat([history[rows.shape[0] - self.capacity :], rows])
        self._rows = combined
        return combined

    def state_dict(self) -> dict[str, Tensor | int]:
        return {"rows": self._rows.cpu().clone(), "capacity": self.capacity, "num_clusters": self.num_clusters}

    def load_state_dict(self, state: dict) -> None:
        rows = state["rows"]
        if int(state["num_clusters"]) != self.num_clusters or rows.shape[0] > self.capacity:
            raise ValueError(
                f"buffer state for K={state['num_clusters']}, {rows.shape[0]} rows does not fit "
                f"this buffer (K={self.num_clusters}, capacity={self.capacity})"
            )
        self._rows = rows.to(device=self.device, dtype=torch.float32, copy=True)


class SharedBuffer(Protocol):
    """The history the discovery step solves over, as every rank sees it (method.md §4.1, §4.7).

    ``history_plus(step, rows [n, K]) -> [J', K]`` returns the stored history with ``rows`` appended (newest
    last); ``commit(step, rows)`` tells the buffer that step ``step``'s rows are final (a shared buffer sends them
    on). :class:`LocalBuffer` is the single-process one; the service's Ray buffer client is the shared one.
    """

    def history_plus(self, step: int, rows: Tensor) -> Tensor: ...
    def commit(self, step: int, rows: Tensor) -> None: ...


class LocalBuffer:
    """Single-process :class:`SharedBuffer`: a plain :class:`LogitBuffer` (no actor) on ``device``."""

    def __init__(self, capacity: int, num_clusters: int, device: torch.device | str | None = None):
        self.buffer = LogitBuffer(capacity, num_clusters, device)

    def history_plus(self, step: int, rows: Tensor) -> Tensor:
        return self.buffer.push(rows)

    def commit(self, step: int, rows: Tensor) -> None:
        """Nothing to share: the local buffer already holds the rows."""

    def state_dict(self) -> dict:
        return self.buffer.state_dict()


def epoch_capped_rows(buffer_rows: int, steps_per_epoch: int, rows_per_step: int, max_epochs: float) -> int:
    """The buffer's capacity ``J`` once it may hold at most ``max_epochs`` of the novel pool's rows.

    Args:
        buffer_rows: ``J`` as configured (rows).
        steps_per_epoch: global steps per epoch (≥ 1).
        rows_per_step: rows a step appends (``views · W · B``).
        max_epochs: the cap in epochs of the pool; ``0`` = no cap.

    Returns:
        ``min(J, ⌊max_epochs · steps_per_epoch⌋ · rows_per_step)``, never below one step's rows: whole steps of
        history, so a solve always sees at least the previous step besides the current one.
    """
    if steps_per_epoch < 1 or rows_per_step < 1 or max_epochs < 0:
        raise ValueError(f"steps_per_epoch and rows_per_step must be >= 1 and max_epochs >= 0, got "
                         f"{steps_per_epoch}, {rows_per_step}, {max_epochs}")
    if max_epochs == 0:
        return buffer_rows
    whole_steps = int(max_epochs * steps_per_epoch + 1e-9)  # 0.2 · 15 is 3.0000000000000004, 0.29 · 100 is 28.999…
    return min(buffer_rows, max(1, whole_steps) * rows_per_step)
