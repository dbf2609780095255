"""Entropic optimal transport and the adaptive self-labeler (method.md §4).

Notation: ``S ∈ [-1, 1]^{N×K}`` novel logits (cosines to the novel prototypes), ``ε`` the entropic
regularisation, ``T`` Sinkhorn iterations, ``L`` outer alternations, ``w`` the cluster-size marginal,
``τ = 1 + exp(t)`` its imbalance factor, ``γ`` the KL weight.

Two solvers compute the same truncated Sinkhorn:

* :func:`sinkhorn` — the plain log-domain reference (logsumexp over the ``[N, K]`` matrix per half
  iteration); equals POT's ``ot.sinkhorn`` iteration for iteration.
* :class:`ScaledKernel` — the fast path used by :class:`AdaptiveSelfLabeler`. Within one labeling call
  the scores do not change across the ``L`` alternations, only ``w`` does. So the kernel
  ``exp(S/ε)`` is rescaled once into a well-conditioned matrix and every later Sinkhorn iteration is a
  matrix-vector product instead of a logsumexp pass (see :meth:`ScaledKernel.from_scores`).

For the scalar priors the labeler differentiates ``F`` in ``t`` in forward mode: the tangent ``dw/dt`` is
carried through the ``T`` Sinkhorn updates next to the solve (:meth:`ScaledKernel.column_scaling_jvp`),
which halves the passes over the kernel against autograd's forward + backward and builds no graph.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

PriorKind = Literal["adaptive", "uniform", "fixed", "free", "bounded", "anchored"]
_SCALAR_PRIORS = ("adaptive", "bounded", "anchored")  # one learned scalar t: derivative in forward mode


def sinkhorn(scores: Tensor, col_marginal: Tensor, eps: float, n_iters: int) -> Tensor:
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

    Returns:
        ``[N, K]`` soft assignments, rows sum to 1; equals
        ``N * ot.sinkhorn(ones(N)/N, col_marginal, -scores, eps, numItermax=n_iters, stopThr=0)``.
    """
    if scores.ndim != 2 or col_marginal.shape != scores.shape[1:]:
        raise ValueError(f"need scores [N, K] and col_marginal [K], got {tuple(scores.shape)} and {tuple(col_marginal.shape)}")
    if n_iters < 1 or eps <= 0:
        raise ValueError(f"need n_iters >= 1 and eps > 0, got {n_iters}, {eps}")
    n = scores.shape[0]
    log_k = scores / eps
    log_a = -math.log(n)
    log_b = torch.log(col_marginal)
    log_u = torch.full((n,), log_a, dtype=scores.dtype, device=scores.device)
    for _ in range(n_iters):
        log_v = log_b - torch.logsumexp(log_k + log_u[:, None], dim=0)
        log_u = log_a - torch.logsumexp(log_k + log_v[None, :], dim=1)
    # The last update normalised the rows, so the row-rescaled plan is a row softmax.
    return torch.softmax(log_k + log_v[None, :], dim=1)


def cluster_prior(t: Tensor, num_clusters: int) -> Tensor:
    """Parametric cluster-size prior ``w_r ∝ τ^(-r/(K-1))``, ``τ = 1 + exp(t)`` (method.md §4.3).

    Args:
        t: scalar tensor, the unconstrained parameter (``t = 0`` ↔ ``τ = 2``).
        num_clusters: ``K``.

    Returns:
        ``[K]`` probabilities, non-increasing in the rank ``r``; differentiable in ``t``.
    """
    if num_clusters == 1:
        return torch.ones(1, dtype=t.dtype, device=t.device)
    ranks = torch.arange(num_clusters, dtype=t.dtype, device=t.device)
    log_tau = F.softplus(t)  # log(1 + e^t), stable for any t
    return torch.softmax(-ranks / (num_clusters - 1) * log_tau, dim=0)


def bounded_cluster_prior(t: Tensor, num_clusters: int, max_imbalance: float) -> Tensor:
    """:func:`cluster_prior` with ``τ`` kept in ``(1, τ_max)``: ``log τ = log(τ_max) · sigmoid(t)``.

    The faithful ``τ = 1 + exp(t)`` is unbounded, and with a small γ the self-labeling feedback (a skewed
    prior → the head clusters get more pseudo-labels → their soft mass grows → the gain favours more skew)
    drives ``τ`` to 10²–10⁷ (method.md §4 trap c). A smooth bound keeps the gradient alive everywhere and
    caps the damage at ``τ_max`` (e.g. the known classes' imbalance ``n_max / n_min``, observable in NCD).

    Args:
        t: scalar tensor; ``t = logit(log 2 / log τ_max)`` gives ``τ = 2``.
        num_clusters: ``K``.
        max_imbalance: ``τ_max > 1``.

    Returns:
        ``[K]`` probabilities, non-increasing in the rank; differentiable in ``t``.
    """
    if num_clusters == 1:
        return torch.ones(1, dtype=t.dtype, device=t.device)
    ranks = torch.arange(num_clusters, dtype=t.dtype, device=t.device)
    log_tau = math.log(max_imbalance) * torch.sigmoid(t)
    return torch.softmax(-ranks / (num_clusters - 1) * log_tau, dim=0)


def kl_divergence(reference: Tensor, w: Tensor) -> Tensor:
    """``KL(a ‖ w) = Σ_k a_k log(a_k / w_k)`` for probability vectors ``[K]`` (nats)."""
    return (reference * (torch.log(reference) - torch.log(w))).sum()


def rank_by_mass(log_mass: Tensor) -> Tensor:
    """``[K]`` rank of each cluster by decreasing soft mass (rank 0 = largest; ties by index)."""
    order = torch.argsort(log_mass, descending=True, stable=True)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.shape[0], device=order.device)
    return rank


def kl_from_uniform(w: Tensor) -> Tensor:
    """``KL(ν ‖ w)`` with ``ν`` uniform over the ``K`` entries of ``w`` (nats)."""
    k = w.shape[0]
    return -math.log(k) - torch.log(w).mean()


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


@dataclass(frozen=True)
class ScaledKernel:
    """The Gibbs kernel ``exp(S/ε)`` rescaled once per labeling call (shapes ``[N, K]``).

    The kernel is stored as ``kernel = exp(S/ε - m - r)`` (column maxima ``m``, row log-normalisers
    ``r``): entries ≤ 1, rows sum to 1 and every column holds an entry ≥ 1/K, so nothing overflows and
    no row or column vanishes in float32 even at ``ε = 0.01``. Sinkhorn's scaling vectors absorb the
    same factors, so the plan is unchanged; the first column update from a uniform ``u`` is available
    in closed form (``ṽ = w / column_mass``).
    """

    kernel: Tensor  # [N, K], detached; the first half of ``stacked``
    weighted: Tensor  # [N, K], kernel ⊙ S, for the transport cost; the second half of ``stacked``
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

    def column_scaling(self, col_marginal: Tensor, n_iters: int) -> Tensor:
        """Rescaled column potential ``ṽ [K]`` after ``T`` column updates (differentiable in ``w``).

        POT's ``T`` iterations end with a row update; that one only normalises the rows, which
        :meth:`rows` and :meth:`transport_gain` do anyway, so ``T`` column and ``T - 1`` row updates
        (``2T - 2`` matvecs) give the same plan.
        """
        n = self.kernel.shape[0]
        v = col_marginal / self.column_mass  # the first update from a uniform u, in closed form
        for _ in range(n_iters - 1):
            u = (1.0 / n) / (self.kernel @ v)
            v = col_marginal / (self.kernel.T @ u)
        return v

    def rows(self, v: Tensor, last: int | None = None) -> Tensor:
        """Row-normalised plan for the column potential ``v``: ``[N, K]``, or its last ``last`` rows."""
        kernel = self.kernel if last is None else self.kernel[-last:]
        return (kernel * v[None, :]).div_((kernel @ v)[:, None])

    def transport_gain(self, v: Tensor) -> Tensor:
        """``mean_i Σ_k Q_ik S_ik`` for the row-normalised plan ``Q`` — two matvecs, no ``[N, K]`` temporaries."""
        return ((self.weighted @ v) / (self.kernel @ v)).mean()

    def column_scaling_jvp(self, col_marginal: Tensor, tangent: Tensor, n_iters: int) -> tuple[Tensor, Tensor]:
        """:meth:`column_scaling` and its directional derivative, forward mode (no autograd).

        Args:
            col_marginal: ``[K]`` marginal ``w``.
            tangent: ``[K]`` direction ``dw`` (the derivative of ``w`` in the learned parameter).

        Returns:
            ``(ṽ, dṽ)``, both ``[K]``. Each Sinkhorn update carries its tangent along: the pair shares one
            product with the kernel on the row side (:func:`_matrix_times_pair`) and on the column side
            (:func:`_pair_times_matrix`), so the derivative adds no pass over the kernel and builds no graph.
        """
        n = self.kernel.shape[0]
        v = col_marginal / self.column_mass
        dv = tangent / self.column_mass
        for _ in range(n_iters - 1):
            kv, kdv = _matrix_times_pair(self.kernel, v, dv)  # K v and K dv, [N] each
            u = (1.0 / n) / kv
            minus_du = (u * kdv).div_(kv)  # du = -u (K dv) / (K v); the sign is folded into dv below
            ktu, minus_ktdu = _pair_times_matrix(u, minus_du, self.kernel)  # Kᵀu and -Kᵀdu, [K] each
            v = col_marginal / ktu
            dv = torch.addcmul(tangent, v, minus_ktdu).div_(ktu)  # (dw - v ⊙ Kᵀdu) / Kᵀu
        return v, dv

    def transport_gain_jvp(self, v: Tensor, dv: Tensor) -> tuple[Tensor, Tensor]:
        """:meth:`transport_gain` and its directional derivative along ``dv`` (one product with ``[K; KS]``)."""
        n = self.kernel.shape[0]
        both, d_both = _matrix_times_pair(self.stacked, v, dv)  # [2N] each: [K v; KS v] and [K dv; KS dv]
        (kv, wv), (kdv, wdv) = both.split(n), d_both.split(n)
        ratio = wv / kv
        return ratio.mean(), torch.addcmul(wdv, ratio, kdv, value=-1).div_(kv).mean()


class AdaptiveSelfLabeler(nn.Module):
    """Adaptive self-labeling: relaxed OT with a learned cluster-size marginal (method.md §4).

    Each call solves, for the given scores, ``L`` alternations of (a) truncated Sinkhorn for
    ``Y(w)`` with the graph kept through the ``T`` iterations and (b) one optimiser step on the
    prior's parameters for

        ``F(w) = -mean_i Σ_k Y_ik S_ik / Σ_k Y_ik + γ · KL(ν ‖ w) / K``.

    ``γ`` keeps this ``/K`` scaling (the paper's γ = 500 was tuned with it); its strength therefore
    grows as K shrinks — small-K problems need a small γ (method.md §4, trap a). ``γ → ∞`` gives the
    uniform prior (UNO's balanced Sinkhorn).

    Priors:
        ``adaptive``: ``w(τ)`` of :func:`cluster_prior`, ranks assigned by decreasing soft mass at
        every call; the learned ``t`` starts at ``init_t = 0`` (τ = 2), where ``dτ/dt`` is alive
        (the authors' τ ≈ 1.0067 barely moves — trap b).
        ``bounded``: ``w(τ)`` of :func:`bounded_cluster_prior`, ``τ < max_imbalance``; starts at the
        same ``τ`` as ``adaptive`` (``1 + exp(init_t)``, clipped below the bound).
        ``anchored``: ``w(τ)`` as ``adaptive``, but the KL term pulls towards ``w(τ̂)`` instead of the
        uniform ``ν`` — ``γ · KL(w(τ̂) ‖ w(τ)) / K`` with ``τ̂ = max_imbalance`` an estimate made outside
        the self-labeling loop (e.g. the known classes' ``n_max / n_min``); ``t`` starts at ``init_t``
        like ``adaptive`` (τ = 2: starting at τ̂ lets an early, arbitrary cluster ranking claim the big sizes).
        ``γ → ∞`` fixes the prior at ``w(τ̂)``; ``γ → 0`` is the unregularised adaptive prior.
        ``uniform``: ``w = 1/K``, nothing learned. ``fixed``: a given size profile (e.g. the true
        one), sorted descending and assigned by soft-mass rank. ``free``: ``w = softmax(θ)``, a
        learned point of the simplex (the paper's non-parametric ablation).

    The parameter and its SGD state persist across calls and are part of ``state_dict()``.
    Identical inputs and state give identical outputs, so DDP ranks solving the same gathered
    problem stay in lock-step.
    """

    def __init__(
        self,
        num_clusters: int,
        prior: PriorKind = "adaptive",
        eps: float = 0.05,
        n_iters: int = 3,
        outer_steps: int = 10,
        gamma: float = 500.0,
        lr: float = 0.1,
        momentum: float = 0.99,
        grad_clip: float = 1.0,
        init_t: float = 0.0,
        fixed_prior: Tensor | None = None,
        max_imbalance: float | None = None,
    ) -> None:
        super().__init__()
        if num_clusters < 1:
            raise ValueError(f"num_clusters must be >= 1, got {num_clusters}")
        if prior not in ("adaptive", "uniform", "fixed", "free", "bounded", "anchored"):
            raise ValueError(f"prior must be adaptive|uniform|fixed|free|bounded|anchored, got {prior!r}")
        if prior in ("bounded", "anchored") and (max_imbalance is None or not max_imbalance > 1):
            raise ValueError(f"prior={prior!r} needs max_imbalance > 1 (bound or anchor τ̂), got {max_imbalance!r}")
        if eps <= 0 or n_iters < 1 or outer_steps < 1 or gamma < 0:
            raise ValueError(f"need eps > 0, n_iters >= 1, outer_steps >= 1, gamma >= 0; got {eps}, {n_iters}, {outer_steps}, {gamma}")
        self.num_clusters = num_clusters
        self.prior = prior
        self.eps = eps
        self.n_iters = n_iters
        self.outer_steps = outer_steps
        self.gamma = gamma
        self.grad_clip = grad_clip
        self.max_imbalance = max_imbalance
        if prior == "adaptive":
            self.t = nn.Parameter(torch.tensor(float(init_t)))
        elif prior == "anchored":
            self.t = nn.Parameter(torch.tensor(float(init_t)))
            self.register_buffer("anchor", cluster_prior(torch.tensor(math.log(max_imbalance - 1.0)), num_clusters))
        elif prior == "bounded":
            start = min(1.0 + math.exp(init_t), 1.0 + 0.5 * (max_imbalance - 1.0))  # τ₀, strictly inside (1, τ_max)
            share = math.log(start) / math.log(max_imbalance)
            self.t = nn.Parameter(torch.tensor(math.log(share / (1.0 - share))))
        elif prior == "free":
            self.logits = nn.Parameter(torch.zeros(num_clusters))
        elif prior == "fixed":
            if fixed_prior is None or fixed_prior.shape != (num_clusters,) or (fixed_prior < 0).any() or fixed_prior.sum() <= 0:
                raise ValueError(f"prior='fixed' needs fixed_prior: non-negative [{num_clusters}] with a positive sum")
            sizes = torch.sort(fixed_prior.detach().float(), descending=True).values
            self.register_buffer("ranked_prior", sizes / sizes.sum())
        self.forward_mode = True  # scalar priors: dF/dt by forward mode; False → autograd through objective()
        self.cuda_graphs = True  # scalar priors on CUDA, from the 2nd call (momentum exists): one graph replay per call
        self._graphs: dict[tuple, _CapturedCall] = {}
        params = list(self.parameters())
        self._optimizer = torch.optim.SGD(params, lr=lr, momentum=momentum) if params else None
        self.last_prior: Tensor = torch.full((num_clusters,), 1.0 / num_clusters)
        self.last_objective: float = float("nan")

    # -- state -------------------------------------------------------------------------------
    @property
    def imbalance_factor(self) -> float:
        """``τ = w_max / w_min`` of the current prior (``1 + exp(t)`` for ``adaptive``)."""
        if self.prior in ("adaptive", "anchored"):
            return 1.0 + math.exp(float(self.t.detach()))
        if self.prior == "bounded":
            return self.max_imbalance ** float(torch.sigmoid(self.t.detach()))
        w = self.last_prior if self.prior != "fixed" else self.ranked_prior
        return float(w.max() / w.min().clamp_min(1e-30))

    def get_extra_state(self) -> dict:
        return {"optimizer": self._optimizer.state_dict() if self._optimizer else {}}

    def set_extra_state(self, state: dict) -> None:
        self._graphs.clear()  # captured graphs point at the momentum tensor that is replaced here
        if self._optimizer is not None and state.get("optimizer"):
            self._optimizer.load_state_dict(copy.deepcopy(state["optimizer"]))  # never alias the source's momentum

    # -- the prior -------------------------------------------------------------------------
    def _column_marginal(self, rank_of_cluster: Tensor) -> Tensor:
        """``[K]`` marginal in cluster order (differentiable in the learned parameter)."""
        k = self.num_clusters
        if self.prior == "uniform":
            return torch.full((k,), 1.0 / k, device=rank_of_cluster.device)
        if self.prior == "free":
            return torch.softmax(self.logits, dim=0)
        if self.prior == "bounded":
            return bounded_cluster_prior(self.t, k, self.max_imbalance)[rank_of_cluster]
        ranked = cluster_prior(self.t, k) if self.prior in ("adaptive", "anchored") else self.ranked_prior
        return ranked[rank_of_cluster]

    def objective(self, kernel: ScaledKernel, col_marginal: Tensor) -> tuple[Tensor, Tensor]:
        """``F(w)`` for the prepared kernel and marginal; also returns the column potential ``ṽ``."""
        v = kernel.column_scaling(col_marginal, self.n_iters)
        if self.prior == "anchored":  # KL is permutation-invariant: compare both profiles in rank order
            divergence = kl_divergence(self.anchor, torch.sort(col_marginal, descending=True).values)
        else:
            divergence = kl_from_uniform(col_marginal)
        value = -kernel.transport_gain(v) + self.gamma * divergence / self.num_clusters
        return value, v

    def relative_ranks(self, like: Tensor) -> Tensor:
        """``ρ_r = r / (K-1)`` for ``r = 0..K-1`` (zeros when K = 1), ``[K]`` with ``like``'s dtype and device."""
        k = self.num_clusters
        return torch.arange(k, dtype=like.dtype, device=like.device) / max(k - 1, 1)

    def _log_tau(self, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """``(s, ds/dt)`` for the scalar priors, ``s = log τ``: softplus(t) (adaptive, anchored) or
        ``log(τ_max)·sigmoid(t)`` (bounded). Detached scalars of ``dtype``."""
        t = self.t.detach().to(dtype)
        if self.prior == "bounded":
            sig = torch.sigmoid(t)
            scale = math.log(self.max_imbalance)
            return scale * sig, scale * sig * (1 - sig)
        return F.softplus(t), torch.sigmoid(t)

    @torch.no_grad()
    def objective_and_derivative(self, kernel: ScaledKernel, rank_of_cluster: Tensor, rho: Tensor | None = None,
                                 *, with_value: bool = True) -> tuple[Tensor | None, Tensor, Tensor, Tensor]:
        """``F``, ``dF/dt``, ``ṽ`` and ``w`` for the scalar priors (adaptive, bounded, anchored), forward mode.

        ``w_r = softmax_r(-ρ_r s)`` with ``ρ_r = r / (K-1)`` and ``s = log τ``, so ``dw_r/ds = w_r (ρ̄ - ρ_r)``
        with ``ρ̄ = Σ_r w_r ρ_r``. That direction is pushed through the ``T`` Sinkhorn updates alongside the
        solve (:meth:`ScaledKernel.column_scaling_jvp`); the KL term's derivative is closed-form:
        ``d KL(ν‖w)/ds = mean(ρ) - ρ̄`` and ``d KL(a‖w)/ds = Σ_r a_r ρ_r - ρ̄ Σ_r a_r`` (anchored; ``w`` in rank order is
        already sorted descending since ``s > 0``). Equals autograd through :meth:`objective` (tested) at a
        fraction of its cost: no graph, one stacked product per Sinkhorn half-step.

        ``rho``: ``[K]`` the relative ranks ``ρ`` (:meth:`relative_ranks`), computed once per call by the caller.
        ``with_value=False`` skips ``F`` itself (returned as None): the SGD step needs only ``dF/dt``, and a call
        reports ``F`` of its last alternation only.

        Returns:
            ``(F, dF/dt, ṽ [K], w [K])`` — scalars are 0-d tensors; ``w`` in cluster order.
        """
        k = self.num_clusters
        dtype = kernel.kernel.dtype
        s, ds_dt = self._log_tau(dtype)
        if rho is None:
            rho = self.relative_ranks(kernel.kernel)
        ranked = torch.softmax(rho * -s, dim=0) if k > 1 else torch.ones_like(rho)
        mean_rho = (ranked * rho).sum()  # ρ̄
        direction = ranked * (mean_rho - rho)  # dw/ds in rank order
        w, dw = ranked[rank_of_cluster], direction[rank_of_cluster]
        v, dv = kernel.column_scaling_jvp(w, dw, self.n_iters)
        gain, dgain = kernel.transport_gain_jvp(v, dv)
        if self.prior == "anchored":
            anchor = self.anchor.to(dtype)
            d_divergence = (anchor * rho).sum() - mean_rho * anchor.sum()
        else:
            d_divergence = (0.5 if k > 1 else 0.0) - mean_rho  # mean(ρ) = 1/2
        derivative = (-dgain + self.gamma * d_divergence / k) * ds_dt
        if not with_value:
            return None, derivative, v, w
        divergence = kl_divergence(anchor, ranked) if self.prior == "anchored" else kl_from_uniform(w)
        return -gain + self.gamma * divergence / k, derivative, v, w

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_graphs"] = {}  # CUDA graphs are neither copyable nor picklable; they are re-captured on use
        return state

    # -- the scalar priors' fast path: forward-mode derivative, SGD in tensor ops, CUDA graphs ----------
    def _momentum_buffer(self) -> Tensor | None:
        return self._optimizer.state.get(self.t, {}).get("momentum_buffer")

    def _sgd_step(self, derivative: Tensor) -> None:
        """``clip_grad_norm_`` then ``SGD(momentum)`` on the scalar ``t`` — torch's arithmetic, in tensor ops.

        No ``.grad`` and no host synchronisation, so a whole call can be captured as one CUDA graph. The
        momentum lives in the optimiser's own state, so ``state_dict()`` and checkpoints are unchanged.
        """
        group = self._optimizer.param_groups[0]
        grad = derivative.to(self.t.dtype).reshape(self.t.shape)
        grad = grad * torch.clamp(self.grad_clip / (grad.abs() + 1e-6), max=1.0)  # the norm of one scalar
        step = grad
        if group["momentum"] != 0:
            state = self._optimizer.state[self.t]
            buf = state.get("momentum_buffer")
            if buf is None:
                state["momentum_buffer"] = buf = grad.clone()
            else:
                buf.mul_(group["momentum"]).add_(grad, alpha=1 - group["dampening"])
            step = buf
        self.t.data.add_(step, alpha=-group["lr"])

    @torch.no_grad()
    def _solve_scalar(self, kernel: ScaledKernel, last: int | None) -> tuple[Tensor, Tensor, Tensor]:
        """``L`` alternations for a scalar prior; returns (labels ``[N or last, K]``, ``F``, ``w [K]``)."""
        rank_of_cluster = rank_by_mass(kernel.log_mass)
        rho = self.relative_ranks(kernel.kernel)
        for step in range(self.outer_steps):
            value, derivative, v, w = self.objective_and_derivative(kernel, rank_of_cluster, rho,
                                                                    with_value=step == self.outer_steps - 1)
            self._sgd_step(derivative)
        return kernel.rows(v, last), value, w

    def _captured(self, shape: torch.Size, last: int | None, device: torch.device) -> "_CapturedCall":
        """The CUDA graph of one call for this shape (captured on first use; a few shapes are kept)."""
        key = (tuple(shape), last, device, self.t.data_ptr(), self._momentum_buffer().data_ptr())
        call = self._graphs.pop(key, None) or _CapturedCall(self, shape, last, device)
        self._graphs[key] = call  # most recently used last
        while len(self._graphs) > 4:
            self._graphs.pop(next(iter(self._graphs)))
        return call

    def forward(self, scores: Tensor, last: int | None = None) -> Tensor:
        """Soft pseudo-labels for ``scores [N, K]`` (detached, float32, rows sum to 1).

        The transport problem is always solved over all ``N`` rows (buffer history + current batch);
        ``last`` returns only the labels of the last ``last`` rows (the current batch), ``[last, K]``,
        saving one ``[N, K]`` pass. Updates the learned prior in place (``L`` optimiser steps) unless
        the prior is fixed/uniform.
        """
        if scores.ndim != 2 or scores.shape[1] != self.num_clusters:
            raise ValueError(f"expected scores [N, {self.num_clusters}], got {tuple(scores.shape)}")
        if scores.shape[0] == 0:
            raise ValueError("scores must have at least one row")
        fast = self._optimizer is not None and self.prior in _SCALAR_PRIORS and self.forward_mode
        if fast and scores.is_cuda and self.cuda_graphs and self._momentum_buffer() is not None:
            if not torch.isfinite(scores).all():  # checked before the replay, which updates t
                raise ValueError("scores must be finite (NaN or inf found)")
            labels, value, w = self._captured(scores.shape, last, scores.device)(scores)
            labels, w = labels.clone(), w.clone()  # the graph's outputs are overwritten by its next replay
        else:
            kernel = ScaledKernel.from_scores(scores.float(), self.eps)
            if not torch.isfinite(kernel.log_mass).all():  # any NaN/inf score reaches its column's mass
                raise ValueError("scores must be finite (NaN or inf found)")
            labels, value, w = (self._solve_scalar if fast else self._solve_autograd)(kernel, last)
        self.last_prior = w
        self.last_objective = float(value)
        return labels

    def _solve_autograd(self, kernel: ScaledKernel, last: int | None) -> tuple[Tensor, Tensor, Tensor]:
        """The reference path (any prior): autograd through :meth:`objective` and the torch optimiser.

        Returns detached (labels ``[N or last, K]``, ``F``, ``w [K]``) like :meth:`_solve_scalar`.
        """
        rank_of_cluster = rank_by_mass(kernel.log_mass)
        with torch.enable_grad():
            if self._optimizer is None:
                w = self._column_marginal(rank_of_cluster)
                value, v = self.objective(kernel, w)
            else:
                for _ in range(self.outer_steps):
                    w = self._column_marginal(rank_of_cluster)
                    value, v = self.objective(kernel, w)
                    self._optimizer.zero_grad(set_to_none=True)
                    value.backward()
                    torch.nn.utils.clip_grad_norm_(self.parameters(), self.grad_clip)
                    self._optimizer.step()
        return kernel.rows(v.detach(), last).detach(), value.detach(), w.detach()


class _CapturedCall:
    """One labeler call (rescale, rank, ``L`` alternations, rows) captured as a CUDA graph.

    On a GPU the call is ~500 small kernels whose launch cost (≈ 12 ms at iNat-2K size) dwarfs their run
    time; a graph replays them in one launch. Shapes are static: the training loop's problem is always
    ``[J, Ku]`` (the buffer is full from the first push), and ``last`` changes only when rows are dropped.
    The graph reads ``t`` and the momentum from their tensors and updates them in place, exactly like the
    eager path (tested against it on a GPU).
    """

    def __init__(self, labeler: AdaptiveSelfLabeler, shape: torch.Size, last: int | None, device: torch.device):
        self.scores = torch.zeros(shape, device=device)
        momentum = labeler._momentum_buffer()
        saved = labeler.t.detach().clone(), momentum.clone()
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):  # warm-up outside the capture (lazy library initialisation)
            labeler._solve_scalar(ScaledKernel.from_scores(self.scores, labeler.eps), last)
        torch.cuda.current_stream(device).wait_stream(side)
        with torch.no_grad():  # undo the warm-up's updates
            labeler.t.copy_(saved[0])
            momentum.copy_(saved[1])
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.outputs = labeler._solve_scalar(ScaledKernel.from_scores(self.scores, labeler.eps), last)

    def __call__(self, scores: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        self.scores.copy_(scores)
        self.graph.replay()
        return self.outputs
