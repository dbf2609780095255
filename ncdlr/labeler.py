"""Adaptive self-labeling (method.md §4): what the labeler solves — the objective, its priors and the alternations.

Notation: ``S ∈ [-1, 1]^{N×K}`` novel logits (cosines to the novel prototypes), ``ε`` the entropic
regularisation, ``T`` Sinkhorn iterations, ``L`` outer alternations, ``w`` the cluster-size marginal
(:mod:`ncdlr.priors`), ``τ`` its imbalance factor, ``γ`` the divergence weight.

The reference path here is plain autograd through :meth:`AdaptiveSelfLabeler.objective`; for the scalar priors
:meth:`AdaptiveSelfLabeler.forward` takes the fast path of :mod:`ncdlr.labeler_fast` (forward-mode ``dF/dt``,
SGD in tensor ops, CUDA-graph replay), tested equal to it.
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from ncdlr import labeler_fast
from ncdlr.method_settings import LabelerConfig
from ncdlr.ot import ScaledKernel, size_exponent
from ncdlr.priors import PriorKind, ScalarPrior, build_prior, rank_by_mass


def ran_past_bound(clusters_empty: float, imbalance: float, bound: float) -> bool:
    """Whether pseudo-labels with ``clusters_empty`` clusters that got none and ``imbalance`` (largest cluster's
    count over the smallest non-empty one; NaN: no pseudo-label) ran past an imbalance ``bound`` > 1: a cluster
    with none is past any bound (its share is 0), and so is an imbalance above it. NaN alone is not (nothing to read)."""
    return clusters_empty > 0 or imbalance > bound


class AdaptiveSelfLabeler(nn.Module):
    """Adaptive self-labeling: relaxed OT with a learned cluster-size marginal (method.md §4).

    Each call solves, for the given scores, ``L`` alternations of (a) truncated Sinkhorn for
    ``Y(w)`` (:class:`~ncdlr.ot.ScaledKernel`) with the graph kept through the ``T`` iterations and (b) one
    optimiser step on the prior's parameters for

        ``F(w) = -mean_i Σ_k Y_ik S_ik / Σ_k Y_ik + γ · D(w) / K``,

    ``D`` the prior's divergence: ``KL(ν ‖ w)`` with ``ν`` uniform, or ``KL(w(τ̂) ‖ w)`` for ``anchored``.
    ``γ`` keeps this ``/K`` scaling (the paper's γ = 500 was tuned with it); its strength therefore
    grows as K shrinks — small-K problems need a small γ (method.md §4, trap a). ``γ → ∞`` gives the
    uniform prior (UNO's balanced Sinkhorn).

    ``prior`` names one of :data:`ncdlr.priors.PRIORS` (``adaptive`` | ``uniform`` | ``fixed`` | ``free`` |
    ``bounded`` | ``anchored``), built with ``init_t``, ``fixed_prior`` and ``max_imbalance``; the module is
    ``self.prior``. ``reg_m = ρ > 0`` relaxes the transport's column marginal as well: ``Y`` then holds the sizes
    ``w`` only up to ``ρ · KL(Yᵀ1 ‖ w)`` (semi-relaxed OT, :func:`ncdlr.ot.sinkhorn`), so a cluster the scores
    ask to be larger or smaller than its rank's ``w_r`` is let be, within that pull; 0 (the default, the paper's)
    keeps ``Yᵀ1 = w``. With ``prior="uniform"`` and ``reg_m = ρ`` one solve is the *exact* solution of the paper's
    relaxed OT problem (eq. 3–4: ``min over Y, w of ⟨Y, -S⟩ + ρ KL(w ‖ ν)`` s.t. ``Yᵀ1 = w``, ``w`` free; ρ in the
    role of γ/Ku), which the parametric ``w(τ)`` and its ``L`` optimiser steps approximate (tests/test_ot.py,
    ``test_relaxed_sizes_towards_the_uniform_marginal_solve_the_papers_relaxed_ot_with_w_free``). ``size_bounds =
    (low, high)`` (relaxed sizes and a prior that does not learn) keeps each cluster's share of a solve in
    ``[low, high]`` (:func:`ncdlr.ot.sinkhorn`; ``labeler.size_floor`` is ``low``): the relaxation may follow the
    scores, but no cluster shrinks below the floor. ``relax_bound`` (relaxed sizes only; ``labeler.relax_bound``,
    resolved) is how far the relaxation may take the pseudo-labels: the training loop hands it each epoch's hard
    pseudo-label counts (:meth:`watch_epoch_sizes`), and once they are more imbalanced than the bound the sizes are
    held at ``w`` for the rest of the run (:attr:`relax_stopped`, checkpointed) — or, with ``relax_tighten = f > 1``,
    ``ρ`` is multiplied by ``f`` at each epoch past it (:attr:`relax_scale`, checkpointed): a firmer pull towards
    ``w`` that keeps the relaxation. The learned
    parameter and its SGD state persist across calls and are part of ``state_dict()``. Identical inputs and state give identical outputs, so DDP ranks solving the same
    gathered problem stay in lock-step.
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
        reg_m: float = 0.0,
        size_bounds: tuple[float, float] | None = None,
        relax_bound: float | None = None,
        relax_tighten: float = 0.0,
    ) -> None:
        super().__init__()
        if num_clusters < 1:
            raise ValueError(f"num_clusters must be >= 1, got {num_clusters}")
        self.prior = build_prior(prior, num_clusters, init_t=init_t, fixed_prior=fixed_prior,
                                 max_imbalance=max_imbalance)
        if eps <= 0 or n_iters < 1 or outer_steps < 1 or gamma < 0:
            raise ValueError(f"need eps > 0, n_iters >= 1, outer_steps >= 1, gamma >= 0; got {eps}, {n_iters}, {outer_steps}, {gamma}")
        self.num_clusters = num_clusters
        self.eps = eps
        size_exponent(reg_m, eps)  # refuses a negative reg_m
        self.reg_m = reg_m
        if size_bounds is not None and (reg_m == 0 or self.prior.learns):
            raise ValueError(f"size bounds hold relaxed sizes under a prior that does not learn: they need reg_m > 0 "
                             f"and prior uniform or fixed, got reg_m={reg_m}, prior={prior!r}")
        self.size_bounds = size_bounds
        if relax_bound is not None and (reg_m == 0 or not relax_bound > 1):
            raise ValueError(f"relax_bound bounds relaxed sizes: it needs reg_m > 0 and a bound > 1, got reg_m={reg_m}, "
                             f"relax_bound={relax_bound}")
        self.relax_bound = relax_bound
        if not (relax_tighten == 0 or relax_tighten > 1):
            raise ValueError(f"relax_tighten is 0 (hold the sizes past the bound) or a factor > 1 on reg_m, "
                             f"got {relax_tighten}")
        self.relax_tighten = relax_tighten
        #: the factor on ``reg_m`` that epochs past :attr:`relax_bound` built up under ``relax_tighten`` (1: none yet;
        #: state: checkpointed, so a resumed run keeps the firmer pull)
        self.relax_scale = 1.0
        #: True once an epoch's pseudo-labels ran past :attr:`relax_bound`: the sizes are held at ``w`` from then on
        #: (state: checkpointed, so a resumed run keeps holding them)
        self.relax_stopped = False
        #: True while a warm-up holds the sizes at ``w`` despite ``reg_m`` > 0 (``labeler.relax_after_epochs``, set per
        #: step by the training loop); a run-time switch, not state: the loop derives it from the step on resume
        self.sizes_held = False
        self.n_iters = n_iters
        self.outer_steps = outer_steps
        self.gamma = gamma
        self.grad_clip = grad_clip
        self.forward_mode = True  # scalar priors: dF/dt by forward mode; False → autograd through objective()
        self.cuda_graphs = True  # scalar priors on CUDA, from the 2nd call (momentum exists): one graph replay per call
        self._graphs = labeler_fast.CapturedCalls()
        self._optimizer = torch.optim.SGD(self.prior.parameters(), lr=lr, momentum=momentum) if self.prior.learns else None
        self.last_prior: Tensor = torch.full((num_clusters,), 1.0 / num_clusters)
        self.last_objective: float = float("nan")

    @classmethod
    def from_config(cls, cfg: LabelerConfig, num_clusters: int, fixed_prior: Tensor | None = None) -> AdaptiveSelfLabeler:
        """The labeler of a run's ``labeler`` config section for ``K = num_clusters`` (``fixed_prior`` ``[K]``: the
        true sizes, for ``prior="fixed"`` only; ``max_imbalance = 0`` means none; ``size_floor`` resolved to a share)."""
        return cls(num_clusters, prior=cfg.prior, eps=cfg.eps, n_iters=cfg.n_iters, outer_steps=cfg.outer_steps,
                   gamma=cfg.gamma_for(num_clusters), lr=cfg.lr, momentum=cfg.momentum, init_t=cfg.init_t, fixed_prior=fixed_prior,
                   max_imbalance=cfg.max_imbalance or None, reg_m=cfg.reg_m,
                   size_bounds=cls.bounds_for(cfg, num_clusters),
                   relax_bound=cls.relax_bound_for(cfg) if cfg.reg_m > 0 else None,
                   relax_tighten=cfg.relax_tighten)

    @staticmethod
    def relax_bound_for(cfg: LabelerConfig) -> float | None:
        """``cfg.relax_bound`` as a number (resolved), or None for ``"none"`` (:meth:`from_config` drops it where
        ``reg_m`` is 0: held sizes have nothing to bound, so a config's bound stays valid under ``--labeler.reg_m 0``)."""
        if cfg.relax_bound == "none":
            return None
        try:
            return float(cfg.relax_bound)
        except ValueError:
            raise ValueError(f"labeler.relax_bound={cfg.relax_bound!r} is not resolved to a number (the trainer fills "
                             f"'known' from the data)") from None

    @staticmethod
    def bounds_for(cfg: LabelerConfig, num_clusters: int) -> tuple[float, float] | None:
        """The size bounds ``(low, 1)`` of ``cfg.size_floor`` (a share, resolved) for ``K = num_clusters``, or None for
        ``"none"``; a floor above ``1/K`` is lowered to it (every cluster then holds ``1/K``)."""
        if cfg.size_floor == "none":
            return None
        try:
            floor = float(cfg.size_floor)
        except ValueError:
            raise ValueError(f"labeler.size_floor={cfg.size_floor!r} is not resolved to a share (the trainer fills "
                             f"'known' from the data)") from None
        if not 0 < floor <= 1:
            raise ValueError(f"labeler.size_floor must be a share in (0, 1], got {floor}")
        return min(floor, 1.0 / num_clusters), 1.0

    # -- state -------------------------------------------------------------------------------
    @property
    def kappa(self) -> float:
        """The Sinkhorn column updates' power ``κ = ρ / (ρ + ε)`` with ``ρ`` = :attr:`reg_m_now` (1: the sizes held at
        ``w``, also while :attr:`sizes_held` and once :attr:`relax_stopped`)."""
        return 1.0 if self.sizes_held or self.relax_stopped else size_exponent(self.reg_m_now, self.eps)

    @property
    def reg_m_now(self) -> float:
        """``ρ`` of the next solve: ``reg_m`` times the :attr:`relax_scale` that ``relax_tighten`` built up."""
        return self.reg_m * self.relax_scale

    @property
    def active_bounds(self) -> tuple[float, float] | None:
        """The size bounds the next solve applies: :attr:`size_bounds`, or None while the sizes are held at ``w``."""
        return None if self.kappa == 1.0 else self.size_bounds

    @property
    def imbalance_factor(self) -> float:
        """``τ = w_max / w_min`` of the current prior (``1 + exp(t)`` for ``adaptive``)."""
        return self.prior.imbalance_factor(self.last_prior)

    def watch_epoch_sizes(self, counts_empty: float, imbalance: float) -> bool:
        """After a self-labeling epoch: its hard pseudo-labels' ``counts_empty`` (clusters that got none) and
        ``imbalance`` (largest count over the smallest non-empty one; :func:`ncdlr.metrics.pseudo_label_sizes`).
        When they ran past :attr:`relax_bound` (:func:`ran_past_bound`): holds the sizes from now on, or with
        ``relax_tighten`` multiplies :attr:`reg_m_now` by it. True when this call stopped or tightened the relaxation."""
        if self.relax_bound is None or self.relax_stopped or self.kappa == 1.0:
            return False
        if not ran_past_bound(counts_empty, imbalance, self.relax_bound):
            return False
        if self.relax_tighten > 0:
            self.relax_scale *= self.relax_tighten
        else:
            self.relax_stopped = True
        return True

    def get_extra_state(self) -> dict:
        return {"optimizer": self._optimizer.state_dict() if self._optimizer else {}, "relax_stopped": self.relax_stopped,
                "relax_scale": self.relax_scale}

    def set_extra_state(self, state: dict) -> None:
        self._graphs.clear()  # captured graphs point at the momentum tensor that is replaced here
        self.relax_stopped = bool(state.get("relax_stopped", False))  # checkpoints before relax_bound: never stopped
        self.relax_scale = float(state.get("relax_scale", 1.0))  # checkpoints before relax_tighten: never tightened
        if self._optimizer is not None and state.get("optimizer"):
            self._optimizer.load_state_dict(copy.deepcopy(state["optimizer"]))  # never alias the source's momentum

    _RENAMED = {"t": "prior.t", "anchor": "prior.anchor", "logits": "prior.logits", "ranked_prior": "prior.ranked"}

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        """Checkpoints written before the priors became modules keep loading: their keys are renamed."""
        for old, new in self._RENAMED.items():
            if prefix + old in state_dict and prefix + new not in state_dict:
                state_dict[prefix + new] = state_dict.pop(prefix + old)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_graphs"] = labeler_fast.CapturedCalls()  # CUDA graphs are neither copyable nor picklable
        return state

    # -- what is solved ----------------------------------------------------------------------
    def objective(self, kernel: ScaledKernel, col_marginal: Tensor) -> tuple[Tensor, Tensor]:
        """``F(w)`` (0-d) for the prepared kernel and the marginal ``w [K]`` in cluster order; also returns the
        column potential ``ṽ [K]``. Differentiable in ``w``."""
        v = kernel.column_scaling(col_marginal, self.n_iters, self.kappa, self.active_bounds)
        divergence = self.prior.divergence(col_marginal)
        value = -kernel.transport_gain(v) + self.gamma * divergence / self.num_clusters
        return value, v

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
        fast = self._optimizer is not None and isinstance(self.prior, ScalarPrior) and self.forward_mode
        if (fast and scores.is_cuda and self.cuda_graphs
                and labeler_fast.momentum_buffer(self._optimizer, self.prior.t) is not None):
            if not torch.isfinite(scores).all():  # checked before the replay, which updates t
                raise ValueError("scores must be finite (NaN or inf found)")
            labels, value, w = self._graphs(self, scores, last)
            labels, w = labels.clone(), w.clone()  # the graph's outputs are overwritten by its next replay
        else:
            kernel = ScaledKernel.from_scores(scores.float(), self.eps)
            if not torch.isfinite(kernel.log_mass).all():  # any NaN/inf score reaches its column's mass
                raise ValueError("scores must be finite (NaN or inf found)")
            labels, value, w = labeler_fast.solve_scalar(self, kernel, last) if fast else self._solve_autograd(kernel, last)
        self.last_prior = w
        self.last_objective = float(value)
        return labels

    def _solve_autograd(self, kernel: ScaledKernel, last: int | None) -> tuple[Tensor, Tensor, Tensor]:
        """The reference path (any prior): autograd through :meth:`objective` and the torch optimiser.

        Returns detached (labels ``[N or last, K]``, ``F``, ``w [K]``) like :func:`ncdlr.labeler_fast.solve_scalar`.
        """
        rank_of_cluster = rank_by_mass(kernel.log_mass)
        with torch.enable_grad():
            if self._optimizer is None:
                w = self.prior.marginal(rank_of_cluster)
                value, v = self.objective(kernel, w)
            else:
                for _ in range(self.outer_steps):
                    w = self.prior.marginal(rank_of_cluster)
                    value, v = self.objective(kernel, w)
                    self._optimizer.zero_grad(set_to_none=True)
                    value.backward()
                    torch.nn.utils.clip_grad_norm_(self.parameters(), self.grad_clip)
                    self._optimizer.step()
        return kernel.rows(v.detach(), last).detach(), value.detach(), w.detach()
