"""How the labeler is made fast for the scalar priors (adaptive, bounded, anchored); what it solves is in
:mod:`ncdlr.labeler`, and every path here is tested equal to its reference path there.

* **Forward-mode derivative** (:func:`objective_and_derivative`): ``dF/dt`` with the tangent ``dw/dt`` carried
  through the ``T`` Sinkhorn updates next to the solve (:func:`column_scaling_jvp`), which halves the passes
  over the kernel against autograd's forward + backward and builds no graph.
* **GEMM layouts**: each update multiplies the kernel by the potential and its tangent in one product, in the
  layout measured fastest for the device and size (:func:`_matrix_times_pair`, :func:`_pair_times_matrix`).
* **SGD in tensor ops** (:func:`sgd_step`): torch's clip + momentum arithmetic without ``.grad`` or a host sync.
* **CUDA graphs** (:class:`CapturedCalls`): on a GPU a whole call is replayed as one captured graph.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor

from ncdlr.ot import ScaledKernel
from ncdlr.priors import ScalarPrior, rank_by_mass

_NARROW_LAYOUT_MAX_BYTES = 8 * 1024**2  # measured crossover 12–16 MiB on a 32 MiB-L3 EPYC (docs/benchmarks.md)


def _narrow_layout(matrix: Tensor) -> bool:
    """Whether ``[a; b] @ Mᵀ`` beats ``M @ [a, b]``: on one CPU thread, for a matrix of at most 8 MiB."""
    return (matrix.device.type == "cpu" and torch.get_num_threads() == 1
            and matrix.numel() * matrix.element_size() <= _NARROW_LAYOUT_MAX_BYTES)


def _matrix_times_pair(matrix: Tensor, a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """``(M a, M b)`` for ``matrix [R, C]`` and vectors ``a, b [C]`` in one GEMM → two ``[R]`` vectors.

    The layout is picked per device and size (measured, ``docs/benchmarks.md``): on one CPU thread
    ``[a; b] @ Mᵀ`` (``[2, C] @ [C, R]``) is 1.2–1.4× faster than ``M @ [a, b]`` while ``M`` is at most a few
    MiB, and leaves both results contiguous; past ≈ 12–16 MiB it turns 1.4–2.5× slower (MKL then packs the
    large operand), hence :data:`_NARROW_LAYOUT_MAX_BYTES`. With several CPU threads only ``M @ [a, b]``
    (``[R, C] @ [C, 2]``, the ``[C, 2]`` operand column-major) splits its ``R`` rows over the threads. On a
    GPU ``M @ [a, b]`` is what the CUDA-graph timings were taken with.
    """
    pair = torch.stack([a, b])
    if _narrow_layout(matrix):
        return (pair @ matrix.T).unbind(0)
    return (matrix @ pair.T).unbind(1)


def _pair_times_matrix(a: Tensor, b: Tensor, matrix: Tensor) -> tuple[Tensor, Tensor]:
    """``(aᵀ M, bᵀ M)`` for ``matrix [R, C]`` and ``a, b [R]``: one ``[2, R] @ [R, C]`` product where
    :func:`_narrow_layout` holds, two vector-matrix products otherwise (those split over threads)."""
    if _narrow_layout(matrix):
        return (torch.stack([a, b]) @ matrix).unbind(0)
    return a @ matrix, b @ matrix


def column_scaling_jvp(kernel: ScaledKernel, col_marginal: Tensor, tangent: Tensor, n_iters: int,
                       kappa: float = 1.0) -> tuple[Tensor, Tensor]:
    """:meth:`ScaledKernel.column_scaling` and its directional derivative, forward mode (no autograd).

    Args:
        col_marginal: ``[K]`` marginal ``w``.
        tangent: ``[K]`` direction ``dw`` (the derivative of ``w`` in the learned parameter).
        kappa: the relaxed column update's power ``κ`` (:func:`ncdlr.ot.size_exponent`; 1 = exact marginal): then
            ``v = b (w / Kᵀu)^κ`` and ``dv = κ v (dw / w - Kᵀdu / Kᵀu)``.

    Returns:
        ``(ṽ, dṽ)``, both ``[K]``. Each Sinkhorn update carries its tangent along: the pair shares one
        product with the kernel on the row side (:func:`_matrix_times_pair`) and on the column side
        (:func:`_pair_times_matrix`), so the derivative adds no pass over the kernel and builds no graph.
    """
    n = kernel.kernel.shape[0]
    update = kernel.column_update(col_marginal, kappa)
    if kappa == 1.0:
        def tangent_of(v: Tensor, ktu: Tensor, minus_ktdu: Tensor) -> Tensor:
            return torch.addcmul(tangent, v, minus_ktdu).div_(ktu)  # (dw - v ⊙ Kᵀdu) / Kᵀu
    else:
        relative = tangent / col_marginal  # dw / w

        def tangent_of(v: Tensor, ktu: Tensor, minus_ktdu: Tensor) -> Tensor:
            return kappa * v * (relative + minus_ktdu / ktu)  # κ v (dw / w - Kᵀdu / Kᵀu)
    v = update(kernel.column_mass)
    dv = tangent_of(v, kernel.column_mass, torch.zeros_like(v))  # the first update: u uniform, du = 0
    for _ in range(n_iters - 1):
        kv, kdv = _matrix_times_pair(kernel.kernel, v, dv)  # K v and K dv, [N] each
        u = (1.0 / n) / kv
        minus_du = (u * kdv).div_(kv)  # du = -u (K dv) / (K v); the sign is folded into dv below
        ktu, minus_ktdu = _pair_times_matrix(u, minus_du, kernel.kernel)  # Kᵀu and -Kᵀdu, [K] each
        v = update(ktu)
        dv = tangent_of(v, ktu, minus_ktdu)
    return v, dv


def transport_gain_jvp(kernel: ScaledKernel, v: Tensor, dv: Tensor) -> tuple[Tensor, Tensor]:
    """:meth:`ScaledKernel.transport_gain` and its directional derivative along ``dv [K]`` (one product with
    ``[K; KS]``)."""
    n = kernel.kernel.shape[0]
    both, d_both = _matrix_times_pair(kernel.stacked, v, dv)  # [2N] each: [K v; KS v] and [K dv; KS dv]
    (kv, wv), (kdv, wdv) = both.split(n), d_both.split(n)
    ratio = wv / kv
    return ratio.mean(), torch.addcmul(wdv, ratio, kdv, value=-1).div_(kv).mean()


@torch.no_grad()
def objective_and_derivative(prior: ScalarPrior, kernel: ScaledKernel, rank_of_cluster: Tensor,
                             rho: Tensor | None = None, *, gamma: float, n_iters: int, kappa: float = 1.0,
                             with_value: bool = True) -> tuple[Tensor | None, Tensor, Tensor, Tensor]:
    """``F``, ``dF/dt``, ``ṽ`` and ``w`` for a scalar prior, forward mode; equals autograd through
    :meth:`ncdlr.labeler.AdaptiveSelfLabeler.objective` (tested) at a fraction of its cost.

    ``w_r = softmax_r(-ρ_r s)`` with ``ρ_r = r / (K-1)`` and ``s = log τ``, so ``dw_r/ds = w_r (ρ̄ - ρ_r)``
    with ``ρ̄ = Σ_r w_r ρ_r``. That direction is pushed through the ``T`` Sinkhorn updates alongside the
    solve (:func:`column_scaling_jvp`); the divergence's derivative in ``s`` is closed-form
    (:meth:`ScalarPrior.divergence_slope`), and ``dF/dt = dF/ds · ds/dt``. No graph, one stacked product per
    Sinkhorn half-step.

    Args:
        rank_of_cluster: ``[K]`` soft-mass ranks (:func:`~ncdlr.priors.rank_by_mass`).
        rho: ``[K]`` the relative ranks ``ρ`` (:meth:`ScalarPrior.relative_ranks`), computed once per call by
            the caller (None: computed here).
        gamma, n_iters, kappa: ``γ``, ``T`` and the column updates' power ``κ`` of the labeler.
        with_value: False skips ``F`` itself (returned as None): the SGD step needs only ``dF/dt``, and a call
            reports ``F`` of its last alternation only.

    Returns:
        ``(F, dF/dt, ṽ [K], w [K])`` — scalars are 0-d tensors; ``w`` in cluster order.
    """
    k = prior.num_clusters
    dtype = kernel.kernel.dtype
    s, ds_dt = prior.log_tau(dtype)
    if rho is None:
        rho = prior.relative_ranks(kernel.kernel)
    ranked = torch.softmax(rho * -s, dim=0) if k > 1 else torch.ones_like(rho)
    mean_rho = (ranked * rho).sum()  # ρ̄
    direction = ranked * (mean_rho - rho)  # dw/ds in rank order
    w, dw = ranked[rank_of_cluster], direction[rank_of_cluster]
    v, dv = column_scaling_jvp(kernel, w, dw, n_iters, kappa)
    gain, dgain = transport_gain_jvp(kernel, v, dv)
    d_divergence = prior.divergence_slope(ranked, rho, mean_rho)
    derivative = (-dgain + gamma * d_divergence / k) * ds_dt
    if not with_value:
        return None, derivative, v, w
    return -gain + gamma * prior.divergence(w, ranked) / k, derivative, v, w


def momentum_buffer(optimizer: torch.optim.SGD, param: Tensor) -> Tensor | None:
    """The SGD momentum of ``param`` (None before the first step)."""
    return optimizer.state.get(param, {}).get("momentum_buffer")


def sgd_step(optimizer: torch.optim.SGD, param: Tensor, derivative: Tensor, grad_clip: float) -> None:
    """``clip_grad_norm_`` then ``SGD(momentum)`` on the scalar ``param`` — torch's arithmetic, in tensor ops.

    No ``.grad`` and no host synchronisation, so a whole call can be captured as one CUDA graph. The
    momentum lives in the optimiser's own state, so ``state_dict()`` and checkpoints are unchanged.
    """
    group = optimizer.param_groups[0]
    grad = derivative.to(param.dtype).reshape(param.shape)
    grad = grad * torch.clamp(grad_clip / (grad.abs() + 1e-6), max=1.0)  # the norm of one scalar
    step = grad
    if group["momentum"] != 0:
        state = optimizer.state[param]
        buf = state.get("momentum_buffer")
        if buf is None:
            state["momentum_buffer"] = buf = grad.clone()
        else:
            buf.mul_(group["momentum"]).add_(grad, alpha=1 - group["dampening"])
        step = buf
    param.data.add_(step, alpha=-group["lr"])


class ScalarLabeler(Protocol):
    """What the fast path reads from :class:`ncdlr.labeler.AdaptiveSelfLabeler` with a scalar prior (passed in:
    this module never imports the labeler)."""

    prior: ScalarPrior
    eps: float
    n_iters: int
    kappa: float
    outer_steps: int
    gamma: float
    grad_clip: float
    _optimizer: torch.optim.SGD  # over ``prior.t``; its momentum is stepped in place by :func:`sgd_step`


@torch.no_grad()
def solve_scalar(labeler: ScalarLabeler, kernel: ScaledKernel, last: int | None) -> tuple[Tensor, Tensor, Tensor]:
    """``L`` alternations for the labeler's scalar prior; returns (labels ``[N or last, K]``, ``F``, ``w [K]``),
    detached, like :meth:`~ncdlr.labeler.AdaptiveSelfLabeler._solve_autograd`."""
    prior = labeler.prior
    rank_of_cluster = rank_by_mass(kernel.log_mass)
    rho = prior.relative_ranks(kernel.kernel)
    for step in range(labeler.outer_steps):
        value, derivative, v, w = objective_and_derivative(prior, kernel, rank_of_cluster, rho, gamma=labeler.gamma,
                                                           n_iters=labeler.n_iters, kappa=labeler.kappa,
                                                           with_value=step == labeler.outer_steps - 1)
        sgd_step(labeler._optimizer, prior.t, derivative, labeler.grad_clip)
    return kernel.rows(v, last), value, w


class CapturedCall:
    """One labeler call (rescale, rank, ``L`` alternations, rows) captured as a CUDA graph.

    On a GPU the call is ~500 small kernels whose launch cost (≈ 12 ms at iNat-2K size) dwarfs their run
    time; a graph replays them in one launch. Shapes are static: the training loop's problem is always
    ``[J, Ku]`` (the buffer is full from the first push), and ``last`` changes only when rows are dropped.
    The graph reads ``t`` and the momentum from their tensors and updates them in place, exactly like the
    eager path (tested against it on a GPU).
    """

    def __init__(self, labeler: ScalarLabeler, shape: torch.Size, last: int | None, device: torch.device):
        self.scores = torch.zeros(shape, device=device)
        t = labeler.prior.t
        momentum = momentum_buffer(labeler._optimizer, t)
        saved = t.detach().clone(), momentum.clone()
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):  # warm-up outside the capture (lazy library initialisation)
            solve_scalar(labeler, ScaledKernel.from_scores(self.scores, labeler.eps), last)
        torch.cuda.current_stream(device).wait_stream(side)
        with torch.no_grad():  # undo the warm-up's updates
            t.copy_(saved[0])
            momentum.copy_(saved[1])
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.outputs = solve_scalar(labeler, ScaledKernel.from_scores(self.scores, labeler.eps), last)

    def __call__(self, scores: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        self.scores.copy_(scores)
        self.graph.replay()
        return self.outputs


class CapturedCalls:
    """The labeler's captured calls, by shape, ``last``, device, the addresses of ``t`` and its momentum (a
    state load replaces the momentum tensor, so an old graph is never replayed) and the size exponent ``κ`` (baked
    into a graph as a constant); the ``capacity`` most recently used are kept."""

    def __init__(self, capacity: int = 4) -> None:
        self.capacity = capacity
        self._calls: dict[tuple, CapturedCall] = {}

    def __len__(self) -> int:
        return len(self._calls)

    def clear(self) -> None:
        self._calls.clear()

    def __call__(self, labeler: ScalarLabeler, scores: Tensor, last: int | None) -> tuple[Tensor, Tensor, Tensor]:
        """Replay the call for ``scores [N, K]`` (captured on first use): detached (labels, ``F``, ``w``), which
        the next replay overwrites."""
        t = labeler.prior.t
        # κ is a constant of the graph: a warm-up that holds the sizes, then relaxes them, needs two graphs
        key = (tuple(scores.shape), last, scores.device, t.data_ptr(),
               momentum_buffer(labeler._optimizer, t).data_ptr(), labeler.kappa)
        call = self._calls.pop(key, None) or CapturedCall(labeler, scores.shape, last, scores.device)
        self._calls[key] = call  # most recently used last
        while len(self._calls) > self.capacity:
            self._calls.pop(next(iter(self._calls)))
        return call(scores)

