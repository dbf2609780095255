"""Cluster-size priors ``w`` of the adaptive self-labeler (method.md §4.3, §4.6).

Every prior is a small :class:`ClusterPrior` module: the column marginal ``w [K]`` for a ranking of the
clusters (rank 0 = largest soft mass), the divergence term of ``F`` (``KL(ν ‖ w)`` with ``ν`` uniform, or
``KL(anchor ‖ w)``), the imbalance factor ``τ = w_max / w_min`` and whether it learns anything. The
parametric ones (:class:`ScalarPrior`: ``adaptive``, ``bounded``, ``anchored``) learn one scalar ``t`` and
have the form ``w_r = softmax_r(-ρ_r s)`` with ``ρ_r = r / (K-1)`` and ``s = log τ``; they also give what the
labeler's forward-mode derivative needs (``s``, ``ds/dt`` and the divergence's derivative in ``s``).

Build one by name with :func:`build_prior` (the registry :data:`PRIORS`).
"""

from __future__ import annotations

import abc
import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

PriorKind = Literal["adaptive", "uniform", "fixed", "free", "bounded", "anchored"]


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


def kl_from_uniform(w: Tensor) -> Tensor:
    """``KL(ν ‖ w)`` with ``ν`` uniform over the ``K`` entries of ``w`` (nats)."""
    k = w.shape[0]
    return -math.log(k) - torch.log(w).mean()


def rank_by_mass(log_mass: Tensor) -> Tensor:
    """``[K]`` rank of each cluster by decreasing soft mass (rank 0 = largest; ties by index)."""
    order = torch.argsort(log_mass, descending=True, stable=True)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.shape[0], device=order.device)
    return rank


class ClusterPrior(nn.Module, abc.ABC):
    """The column marginal ``w [K]`` of the labeler's transport problem and its divergence term."""

    kind: str  # the name in :data:`PRIORS`
    options: tuple[str, ...] = ()  # the keywords of :func:`build_prior` its constructor takes
    learns: bool = False  # whether it has a learned parameter (stepped by the labeler's optimiser)

    def __init__(self, num_clusters: int) -> None:
        super().__init__()
        self.num_clusters = num_clusters

    @abc.abstractmethod
    def marginal(self, rank_of_cluster: Tensor) -> Tensor:
        """``[K]`` marginal in cluster order for ``rank_of_cluster [K]`` (:func:`rank_by_mass`); differentiable in
        the learned parameter."""

    def divergence(self, w: Tensor, ranked: Tensor | None = None) -> Tensor:
        """The regulariser of ``F``: ``KL(ν ‖ w)`` for the marginal ``w [K]`` (0 at ``w = ν``).

        ``ranked``: ``w`` in rank order, where the caller has it (the anchored prior then skips a sort).
        """
        return kl_from_uniform(w)

    def imbalance_factor(self, last_marginal: Tensor) -> float:
        """``τ = w_max / w_min``; priors without a closed form measure it on ``last_marginal [K]``, the last one
        used."""
        return float(last_marginal.max() / last_marginal.min().clamp_min(1e-30))


class UniformPrior(ClusterPrior):
    """``w = 1/K``, nothing learned (UNO's balanced Sinkhorn, the ``γ → ∞`` limit)."""

    kind = "uniform"

    def marginal(self, rank_of_cluster: Tensor) -> Tensor:
        k = self.num_clusters
        return torch.full((k,), 1.0 / k, device=rank_of_cluster.device)


class FixedPrior(ClusterPrior):
    """A given size profile (the ORACLE ablation: the true novel sizes), sorted descending and assigned to the
    clusters by soft-mass rank. Nothing learned."""

    kind = "fixed"
    options = ("fixed_prior",)

    def __init__(self, num_clusters: int, fixed_prior: Tensor | None) -> None:
        super().__init__(num_clusters)
        if fixed_prior is None or fixed_prior.shape != (num_clusters,) or (fixed_prior < 0).any() or fixed_prior.sum() <= 0:
            raise ValueError(f"prior='fixed' needs fixed_prior: non-negative [{num_clusters}] with a positive sum")
        sizes = torch.sort(fixed_prior.detach().float(), descending=True).values
        self.register_buffer("ranked", sizes / sizes.sum())  # [K], rank order, sums to 1

    def marginal(self, rank_of_cluster: Tensor) -> Tensor:
        return self.ranked[rank_of_cluster]

    def imbalance_factor(self, last_marginal: Tensor) -> float:
        return super().imbalance_factor(self.ranked)


class FreePrior(ClusterPrior):
    """``w = softmax(θ)``: a learned point of the simplex, in cluster order (the non-parametric ablation);
    ``θ = 0`` (uniform) at the start."""

    kind = "free"
    learns = True

    def __init__(self, num_clusters: int) -> None:
        super().__init__(num_clusters)
        self.logits = nn.Parameter(torch.zeros(num_clusters))

    def marginal(self, rank_of_cluster: Tensor) -> Tensor:
        return torch.softmax(self.logits, dim=0)


class ScalarPrior(ClusterPrior):
    """``w_r = softmax_r(-ρ_r s)`` in rank order, ``ρ_r = r / (K-1)``, with ``s = log τ`` a function of one learned
    scalar ``t``."""

    learns = True
    t: nn.Parameter

    @abc.abstractmethod
    def ranked(self) -> Tensor:
        """``[K]`` marginal in rank order (non-increasing), differentiable in ``t``."""

    @abc.abstractmethod
    def log_tau(self, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """``(s, ds/dt)`` at the current ``t``, ``s = log τ``: detached scalars of ``dtype``."""

    def marginal(self, rank_of_cluster: Tensor) -> Tensor:
        return self.ranked()[rank_of_cluster]

    def relative_ranks(self, like: Tensor) -> Tensor:
        """``ρ_r = r / (K-1)`` for ``r = 0..K-1`` (zeros when K = 1), ``[K]`` with ``like``'s dtype and device."""
        k = self.num_clusters
        return torch.arange(k, dtype=like.dtype, device=like.device) / max(k - 1, 1)

    def divergence_slope(self, ranked: Tensor, rho: Tensor, mean_rho: Tensor) -> Tensor:
        """``d divergence / ds`` at ``ranked = w(s)`` in rank order, closed form: ``d KL(ν‖w)/ds = mean(ρ) - ρ̄``
        with ``ρ̄ = Σ_r w_r ρ_r`` (``mean_rho``) and ``mean(ρ) = 1/2``."""
        return (0.5 if self.num_clusters > 1 else 0.0) - mean_rho


class AdaptivePrior(ScalarPrior):
    """``w(τ)`` of :func:`cluster_prior`, ``τ = 1 + e^t``; ``t`` starts at ``init_t = 0`` (τ = 2), where ``dτ/dt``
    is alive (the authors' τ ≈ 1.0067 barely moves — method.md §4 trap b)."""

    kind = "adaptive"
    options = ("init_t",)

    def __init__(self, num_clusters: int, init_t: float = 0.0) -> None:
        super().__init__(num_clusters)
        self.t = nn.Parameter(torch.tensor(float(init_t)))

    def ranked(self) -> Tensor:
        return cluster_prior(self.t, self.num_clusters)

    def log_tau(self, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        t = self.t.detach().to(dtype)
        return F.softplus(t), torch.sigmoid(t)

    def imbalance_factor(self, last_marginal: Tensor) -> float:
        return 1.0 + math.exp(float(self.t.detach()))


def _check_max_imbalance(kind: str, max_imbalance: float | None) -> float:
    if max_imbalance is None or not max_imbalance > 1:
        raise ValueError(f"prior={kind!r} needs max_imbalance > 1 (bound or anchor τ̂), got {max_imbalance!r}")
    return max_imbalance


class BoundedPrior(ScalarPrior):
    """``w(τ)`` of :func:`bounded_cluster_prior`, ``τ = τ_max^sigmoid(t) < max_imbalance``; starts at the same ``τ``
    as :class:`AdaptivePrior` (``1 + exp(init_t)``, clipped below the bound)."""

    kind = "bounded"
    options = ("max_imbalance", "init_t")

    def __init__(self, num_clusters: int, max_imbalance: float | None, init_t: float = 0.0) -> None:
        super().__init__(num_clusters)
        self.max_imbalance = _check_max_imbalance(self.kind, max_imbalance)
        start = min(1.0 + math.exp(init_t), 1.0 + 0.5 * (max_imbalance - 1.0))  # τ₀, strictly inside (1, τ_max)
        share = math.log(start) / math.log(max_imbalance)
        self.t = nn.Parameter(torch.tensor(math.log(share / (1.0 - share))))

    def ranked(self) -> Tensor:
        return bounded_cluster_prior(self.t, self.num_clusters, self.max_imbalance)

    def log_tau(self, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        t = self.t.detach().to(dtype)
        sig = torch.sigmoid(t)
        scale = math.log(self.max_imbalance)
        return scale * sig, scale * sig * (1 - sig)

    def imbalance_factor(self, last_marginal: Tensor) -> float:
        return self.max_imbalance ** float(torch.sigmoid(self.t.detach()))


class AnchoredPrior(AdaptivePrior):
    """``w(τ)`` as :class:`AdaptivePrior`, but the divergence pulls towards ``w(τ̂)`` instead of the uniform ``ν``:
    ``KL(w(τ̂) ‖ w(τ))`` with ``τ̂ = max_imbalance``, an estimate made outside the self-labeling loop (e.g. the
    known classes' ``n_max / n_min``). ``t`` starts at ``init_t`` (τ = 2: starting at τ̂ lets an early, arbitrary
    cluster ranking claim the big sizes). ``γ → ∞`` fixes the prior at ``w(τ̂)``."""

    kind = "anchored"
    options = ("max_imbalance", "init_t")

    def __init__(self, num_clusters: int, max_imbalance: float | None, init_t: float = 0.0) -> None:
        super().__init__(num_clusters, init_t)
        max_imbalance = _check_max_imbalance(self.kind, max_imbalance)
        self.register_buffer("anchor", cluster_prior(torch.tensor(math.log(max_imbalance - 1.0)), num_clusters))

    def divergence(self, w: Tensor, ranked: Tensor | None = None) -> Tensor:
        """``KL(w(τ̂) ‖ w)``; KL is permutation-invariant, so both profiles are compared in rank order."""
        if ranked is None:
            return kl_divergence(self.anchor, torch.sort(w, descending=True).values)
        return kl_divergence(self.anchor.to(ranked.dtype), ranked)

    def divergence_slope(self, ranked: Tensor, rho: Tensor, mean_rho: Tensor) -> Tensor:
        """``d KL(a‖w)/ds = Σ_r a_r ρ_r - ρ̄ Σ_r a_r`` (``a`` the anchor; ``ranked`` is sorted descending since
        ``s > 0``)."""
        anchor = self.anchor.to(ranked.dtype)
        return (anchor * rho).sum() - mean_rho * anchor.sum()


PRIORS: dict[str, type[ClusterPrior]] = {
    cls.kind: cls for cls in (AdaptivePrior, UniformPrior, FixedPrior, FreePrior, BoundedPrior, AnchoredPrior)
}


def build_prior(kind: PriorKind, num_clusters: int, *, init_t: float = 0.0, fixed_prior: Tensor | None = None,
                max_imbalance: float | None = None) -> ClusterPrior:
    """The prior named ``kind`` for ``K = num_clusters``; each takes the options it needs (``init_t``: the
    scalar priors' start, ``fixed_prior``: ``[K]`` sizes of ``fixed``, ``max_imbalance``: ``τ_max``/``τ̂`` of
    ``bounded``/``anchored``) and checks them."""
    if kind not in PRIORS:
        raise ValueError(f"prior must be {'|'.join(PRIORS)}, got {kind!r}")
    cls = PRIORS[kind]
    given = {"init_t": init_t, "fixed_prior": fixed_prior, "max_imbalance": max_imbalance}
    return cls(num_clusters, **{name: given[name] for name in cls.options})
