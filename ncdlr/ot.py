"""Entropic optimal transport for the self-labeler (method.md §4.2): what one Sinkhorn solve computes.

For scores ``S [N, K]``, a uniform row marginal and a column marginal ``w [K]``, the plan is

    ``Y = argmin_Y ⟨Y, -S⟩ - ε H(Y)``  s.t. ``Y 1 = 1/N``, ``Yᵀ 1 = w``,

truncated to ``T`` Sinkhorn-Knopp iterations; pseudo-labels are its rows rescaled to sum 1 (``N · Y``).
:func:`sinkhorn` is the log-domain reference; :class:`ScaledKernel` solves the same truncated problem with
matrix-vector products on a kernel rescaled once, for the many solves with the same ``S`` and changing ``w``
that :class:`~ncdlr.labeler.AdaptiveSelfLabeler` makes (what it solves: :mod:`ncdlr.labeler`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor


def size_exponent(reg_m: float, eps: float) -> float:
    """``κ = ρ / (ρ + ε)``: the power of a column update ``v ← (w / Kᵀu)^κ`` when the column marginal is relaxed by
    ``ρ · KL(Yᵀ1 ‖ w)`` (semi-relaxed OT, POT's ``reg_m``); ``ρ = 0`` stands for the exact marginal (``κ = 1``)."""
    if reg_m < 0 or eps <= 0:
        raise ValueError(f"need reg_m >= 0 and eps > 0, got {reg_m}, {eps}")
    return 1.0 if reg_m == 0 else reg_m / (reg_m + eps)


def capped_shares(sizes: Tensor, low: float, high: float, n_bisect: int = 60) -> Tensor:
    """The shares ``p [K]`` closest to ``sizes [K]`` (≥ 0, any scale) in KL with ``Σ p = 1`` and ``low ≤ p ≤ high``:
    ``p = clip(λ · sizes, low, high)`` with the one ``λ > 0`` that makes them sum to 1 (found by bisection on ``log λ``
    without a host sync, then solved exactly on the bracketed piece). Needs ``K·low ≤ 1 ≤ K·high``."""
    k = sizes.numel()
    if not (0 <= low and k * low <= 1 + 1e-9 and k * high >= 1 - 1e-9 and low <= high):
        raise ValueError(f"size bounds [{low}, {high}] cannot hold shares of {k} clusters (need K·low ≤ 1 ≤ K·high)")
    q = sizes.double()
    q = q / q.sum()
    tiny = torch.finfo(torch.float64).tiny
    log_q = torch.log(q.clamp_min(tiny))
    lo = math.log(max(low, tiny)) - log_q.max()  # λ = e^lo puts every share at or below ``low``: the sum ≤ 1
    hi = math.log(high) - log_q.min()  # every share at or above ``high``: the sum ≥ 1
    for _ in range(n_bisect):
        mid = (lo + hi) / 2
        short = (torch.exp(mid + log_q).clamp(low, high).sum() < 1)
        lo, hi = torch.where(short, mid, lo), torch.where(short, hi, mid)
    scaled = torch.exp(hi + log_q)
    at_low, at_high = scaled <= low, scaled >= high
    free = ~(at_low | at_high)
    rest = 1 - low * at_low.sum() - high * at_high.sum()
    exact = rest / torch.where(free, q, 0).sum().clamp_min(tiny)  # λ on the piece where the free shares are linear
    lam = torch.where(free.any(), exact, torch.exp(hi))
    return (lam * q).clamp(low, high).to(sizes.dtype)


def sinkhorn(scores: Tensor, col_marginal: Tensor, eps: float, n_iters: int, reg_m: float = 0.0,
             bounds: tuple[float, float] | None = None) -> Tensor:
    """Truncated entropic OT between a uniform row marginal and ``col_marginal``, in the log domain.

    Solves ``min_Y ⟨Y, -S⟩ - ε H(Y)`` s.t. ``Y 1 = 1/N``, ``Yᵀ 1 = w`` with ``n_iters`` Sinkhorn-Knopp
    iterations ``v ← w / (Kᵀu)``, ``u ← (1/N) / (K v)`` with ``K = exp(S/ε)``, starting from a uniform
    ``u`` and updating the column side first (POT's order). After the final row update every row of
    ``Y`` sums to ``1/N``; the result is ``N · Y``, i.e. per-row distributions.

    Args:
        scores: ``[N, K]`` similarities ``S`` (the cost is ``-S``).
        col_marginal: ``[K]`` non-negative, sums to 1 (cluster sizes ``w``); gradients flow into it.
        eps: ``ε > 0``; 0.05 by default in the paper, 0.01 for fine-grained sets (safe here: no ``exp``
            of ``S/ε`` is ever formed).
        n_iters: ``T >= 1``.
        reg_m: ``ρ ≥ 0``; ``ρ > 0`` relaxes the column marginal (semi-relaxed OT): the plan minimises
            ``⟨Y, -S⟩ - ε H(Y) + ρ KL(Yᵀ1 ‖ w)`` with the rows still exact, so cluster sizes move from ``w``
            towards what the scores ask for, and each column update becomes ``v ← (w / Kᵀu)^κ``,
            ``κ = ρ / (ρ + ε)`` (:func:`size_exponent`). 0 (the default) keeps ``Yᵀ1 = w``. With ``w`` uniform
            this is the paper's relaxed OT with the sizes ``w`` free and ``ρ KL(w ‖ ν)`` as their penalty.
        bounds: ``(low, high)`` or None; with ``reg_m > 0``, the relaxed sizes are held to shares in ``[low, high]``
            (the labeler's ``labeler.size_floor`` is ``low``): each column update projects the sizes it would set onto them
            (:func:`capped_shares`). At convergence that is the semi-relaxed problem with the constraint
            ``low ≤ Yᵀ1 ≤ high`` added (the projection's ``λ`` is absorbed by the row potentials).

    Returns:
        ``[N, K]`` soft assignments, rows sum to 1; equals
        ``N * ot.sinkhorn(ones(N)/N, col_marginal, -scores, eps, numItermax=n_iters, stopThr=0)``, and with
        ``reg_m > 0`` the row-normalised ``ot.unbalanced.sinkhorn_unbalanced(.., reg_m=(inf, reg_m),
        reg_type="entropy")`` once both have converged.
    """
    if scores.ndim != 2 or col_marginal.shape != scores.shape[1:]:
        raise ValueError(f"need scores [N, K] and col_marginal [K], got {tuple(scores.shape)} and {tuple(col_marginal.shape)}")
    if n_iters < 1 or eps <= 0:
        raise ValueError(f"need n_iters >= 1 and eps > 0, got {n_iters}, {eps}")
    n = scores.shape[0]
    kappa = size_exponent(reg_m, eps)
    _check_bounds(bounds, kappa)
    log_k = scores / eps
    log_a = -math.log(n)
    log_b = torch.log(col_marginal)
    log_u = torch.full((n,), log_a, dtype=scores.dtype, device=scores.device)
    for _ in range(n_iters):
        log_z = torch.logsumexp(log_k + log_u[:, None], dim=0)
        log_v = kappa * (log_b - log_z)
        if bounds is not None:  # the sizes this update sets are v ⊙ z: project their shares, keep their total
            log_sizes = log_v + log_z
            total = torch.logsumexp(log_sizes, dim=0)
            log_v = torch.log(capped_shares(torch.exp(log_sizes - total), *bounds)) + total - log_z
        log_u = log_a - torch.logsumexp(log_k + log_v[None, :], dim=1)
    # The last update normalised the rows, so the row-rescaled plan is a row softmax.
    return torch.softmax(log_k + log_v[None, :], dim=1)


def _check_bounds(bounds: tuple[float, float] | None, kappa: float) -> None:
    if bounds is not None and kappa == 1.0:
        raise ValueError("size bounds hold relaxed sizes: they need reg_m > 0 (held sizes are w exactly)")


@dataclass(frozen=True)
class ScaledKernel:
    """The Gibbs kernel ``exp(S/ε)`` of ``scores [N, K]``, rescaled once: each later Sinkhorn iteration is two
    matrix-vector products instead of two logsumexp passes over ``[N, K]``.

    The kernel is stored as ``kernel = exp(S/ε - m - r)`` (column maxima ``m``, row log-normalisers
    ``r``): entries ≤ 1, rows sum to 1 and every column holds an entry ≥ 1/K, so nothing overflows and
    no row or column vanishes in float32 even at ``ε = 0.01``. Sinkhorn's scaling vectors absorb the
    same factors, so the plan is unchanged; the first column update from a uniform ``u`` is available
    in closed form (``ṽ = w / column_mass``). All fields are detached.
    """

    kernel: Tensor  # [N, K]; the first half of ``stacked``
    weighted: Tensor  # [N, K], kernel ⊙ S, for the transport gain; the second half of ``stacked``
    column_mass: Tensor  # [K], Σ_i kernel_ik e^{r_i} = e^{c_k - m_k} ≥ 1: first column update is ṽ = w / column_mass
    log_mass: Tensor  # [K], c_k = log Σ_i exp(S_ik/ε); clusters are ranked by it (method.md §4.3)
    stacked: Tensor  # [2N, K] = [kernel; weighted] in one block: one product gives both halves of the gain

    @classmethod
    def from_scores(cls, scores: Tensor, eps: float) -> "ScaledKernel":
        """Rescale ``exp(S/ε)`` for ``scores [N, K]`` with a single ``exp`` pass, in place where possible.

        Columns are shifted by their maximum ``m_k``, then each row by its own maximum ``ρ_i ≤ 0``, then
        exponentiated and normalised by the row sum ``σ_i ≥ 1``. So ``kernel = exp(S/ε - m - r)`` with
        ``r_i = ρ_i + log σ_i = log Σ_k exp(S_ik/ε - m_k)``: entries ≤ 1, rows sum to 1, and every column
        holds an entry ≥ 1/K (at the row of its maximum, whose row maximum is 0). The log soft mass follows
        without another exp pass: ``c_k = m_k + log Σ_i kernel_ik e^{r_i}``.
        """
        scores = scores.detach()
        n, k = scores.shape
        stacked = torch.empty(2 * n, k, dtype=scores.dtype, device=scores.device)
        kernel, weighted = stacked[:n], stacked[n:]
        torch.div(scores, eps, out=kernel)
        col_max = kernel.amax(dim=0)
        kernel.sub_(col_max)
        row_max = kernel.amax(dim=1)
        kernel.sub_(row_max[:, None]).exp_()
        row_sum = kernel.sum(dim=1)
        kernel.div_(row_sum[:, None])
        row_lse = row_max + torch.log(row_sum)
        column_mass = torch.exp(row_lse) @ kernel
        torch.mul(kernel, scores, out=weighted)
        return cls(kernel, weighted, column_mass, col_max + torch.log(column_mass), stacked)

    def column_scaling(self, col_marginal: Tensor, n_iters: int, kappa: float = 1.0,
                       bounds: tuple[float, float] | None = None) -> Tensor:
        """Rescaled column potential ``ṽ [K]`` after ``T`` column updates for the marginal ``w [K]``
        (differentiable in ``w``); ``kappa`` < 1 relaxes the marginal (:func:`size_exponent`, :meth:`column_update`),
        ``bounds`` hold the relaxed sizes' shares (:func:`sinkhorn`).

        POT's ``T`` iterations end with a row update; that one only normalises the rows, which
        :meth:`rows` and :meth:`transport_gain` do anyway, so ``T`` column and ``T - 1`` row updates
        (``2T - 2`` matvecs) give the same plan.
        """
        n = self.kernel.shape[0]
        update = self.column_update(col_marginal, kappa, bounds)
        v = update(self.column_mass)  # the first update from a uniform u, in closed form
        for _ in range(n_iters - 1):
            u = (1.0 / n) / (self.kernel @ v)
            v = update(self.kernel.T @ u)
        return v

    def column_update(self, col_marginal: Tensor, kappa: float = 1.0,
                      bounds: tuple[float, float] | None = None) -> Callable[[Tensor], Tensor]:
        """The column update ``Kᵀu [K] → ṽ [K]`` for the marginal ``w``: ``w / Kᵀu``, or relaxed (``κ < 1``)
        ``b ⊙ (w / Kᵀu)^κ`` with ``b`` = :meth:`relaxed_base`; with ``bounds``, the sizes that sets (``ṽ ⊙ Kᵀu``, true
        up to one factor, as the rescaling leaves them) are projected onto the bounded shares
        (:func:`capped_shares`), their total kept."""
        _check_bounds(bounds, kappa)
        if kappa == 1.0:
            return lambda denominator: col_marginal / denominator
        base = self.relaxed_base(kappa)
        if bounds is None:
            return lambda denominator: base * (col_marginal / denominator) ** kappa

        def bounded(denominator: Tensor) -> Tensor:
            sizes = base * (col_marginal / denominator) ** kappa * denominator
            return capped_shares(sizes, *bounds) * sizes.sum() / denominator
        return bounded

    def relaxed_base(self, kappa: float) -> Tensor:
        """``[K]`` factor ``exp((1 - κ)(m_k - max m))`` of a relaxed column update in the rescaled kernel.

        The kernel is stored with its column maxima ``m`` divided out, so ``ṽ = e^m v``; the exact update's ``w /
        Kᵀu`` commutes with that rescaling, the relaxed ``(w / Kᵀu)^κ`` leaves ``e^{(1-κ) m}`` behind (shifted by
        its maximum, which the row normalisation cancels, so nothing overflows).
        """
        col_max = self.log_mass - torch.log(self.column_mass)
        return torch.exp((1.0 - kappa) * (col_max - col_max.max()))

    def rows(self, v: Tensor, last: int | None = None) -> Tensor:
        """Row-normalised plan ``Q`` for the column potential ``v [K]``: ``[N, K]``, or its last ``last`` rows."""
        kernel = self.kernel if last is None else self.kernel[-last:]
        return (kernel * v[None, :]).div_((kernel @ v)[:, None])

    def transport_gain(self, v: Tensor) -> Tensor:
        """``mean_i Σ_k Q_ik S_ik`` (0-d) for the row-normalised plan ``Q`` of ``v [K]`` — two matvecs, no ``[N, K]``
        temporaries."""
        return ((self.weighted @ v) / (self.kernel @ v)).mean()
