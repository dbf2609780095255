"""The method layer's two config sections, ``labeler`` and ``method``: plain dataclasses, importable without torch.

They are the method layer's own (the labeler and the methods are built straight from them:
:meth:`ncdlr.labeler.AdaptiveSelfLabeler.from_config`, :func:`ncdlr.methods.build_method`); the service's
:class:`~ncdlr.service.config.Config` composes them with its own sections. They sit in this module rather than
beside the classes they configure so that reading a config (and ``ncdlr --help``, which lists every field from
the ``#:`` comments) does not import torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: the γ that stands for the uniform-prior limit (γ → ∞: ``labeler.prior = uniform``), where γ is searched or chosen
GAMMA_UNIFORM = math.inf


@dataclass
class LabelerConfig:
    """Adaptive self-labeling (method.md §4): ε, T, L, γ and the τ optimiser, plus the logit buffer."""

    prior: str = "adaptive"  #: "adaptive" | "uniform" | "fixed" (ORACLE ablation: the true novel training counts) | "free" | "bounded" (τ ≤ max_imbalance) | "anchored" (KL to w(max_imbalance))
    eps: float = 0.05  #: ε, entropic regularisation (method.md: 0.01 for fine-grained sets; measured on four real long-tailed image sets, 0.01 clustered the unlabelled pool worse and lost 2.7 novel points against 0.05, and 0.1 lost too: results.md, sessions 14 and 52)
    n_iters: int = 3  #: T, Sinkhorn iterations per solve
    outer_steps: int = 10  #: L, alternations of (solve Y, step on t) per training step
    gamma: float = 500.0  #: γ, weight of KL(ν‖w)/Ku; tune per Ku (method.md §4 trap a)
    gamma_per_cluster: float = 0.0  #: > 0: γ = gamma_per_cluster · Ku, from the run's Ku (γ/Ku is what transfers across datasets); 0: gamma as given; a later gamma resets it
    lr: float = 0.1  #: SGD learning rate of t
    momentum: float = 0.99  #: SGD momentum of t
    init_t: float = 0.0  #: initial t (τ = 1 + e^t = 2 at t = 0, where dτ/dt is alive)
    buffer_size: int = 2048  #: J, rows of the global FIFO of novel logits
    buffer_epochs: float = 0.0  #: > 0: the buffer holds at most this many epochs of the novel pool's rows (whole steps, at least one; buffer_size still bounds it), filled in by the trainer once the pool's size is known, with a line when it shortens the buffer. 0 = buffer_size as given (the paper's J). Measured on the bare cache command (J 2048, batch 128; results.md, session 64): 0.2 won 6.1 novel points on Emoji-LT p0 (2048 rows were 0.73 of its small pool's epoch and left clusters without a pseudo-label in 40 of 50 epochs) and lost 4.1 on OpenClipart-LT p0 (the tail); 0.5 gained 2.0 (SE 1.4) and cost 6.4 known points on Emoji-LT; 0.2 on Tabler-LT p0 (session 65) +0.4 (SE 5.0), the tail down again, so it stays off
    use_buffer: bool = True  #: off → solve on the current gathered batch only
    reg_m: float = 0.0  #: ρ ≥ 0; > 0 relaxes the transport's column marginal too (semi-relaxed OT, POT's reg_m): cluster sizes are pulled towards w by ρ·KL(Yᵀ1‖w) instead of held at w; 0 = held (the paper's). Compare with ε: each Sinkhorn column update is raised to ρ/(ρ+ε)
    max_imbalance: float = 0.0  #: τ̂ > 1 for priors "bounded" (upper bound of τ) and "anchored" (KL target); 0: the known classes' training n_max/n_min, filled in by the trainer for those priors
    size_floor: str = "none"  #: with reg_m > 0 and prior uniform (or fixed): the smallest share of a solve's rows a cluster keeps — "none" | "known" (the rarest known class's training count over the novel training rows, filled in by the trainer: no novel cluster shrinks below the rarest labelled class) | a share in (0, 1/Ku], e.g. "0.005"
    relax_bound: str = "none"  #: with reg_m > 0: the most imbalanced the relaxation may make the pseudo-labels — once an epoch's hard pseudo-labels are more imbalanced than this (largest cluster's count over the smallest's; a cluster with none counts as past it), the rest of the run holds the sizes at w (reg_m 0's transport). "none" | "known" (the known classes' training n_max/n_min, filled in by the trainer: the relaxation may follow the data's long tail as far as the labelled classes show it, not run past it) | a number > 1. Inert with reg_m 0. Label-free; against relaxed sizes that empty clusters on a set with many novel classes (results.md, session 49)
    relax_tighten: float = 0.0  #: with reg_m > 0 and a relax_bound: what an epoch past the bound does — 0: the rest of the run holds the sizes at w (the guard as built in session 49); a factor f > 1: reg_m is multiplied by f instead (a firmer pull towards w, the relaxation kept), again at each later epoch past the bound. Built against the tail the held sizes lose once the guard trips early on a short buffer (results.md, sessions 66 and 72)
    relax_after_epochs: float = 0.0  #: with reg_m > 0: the first epochs of self-labeling hold the cluster sizes at w (as reg_m 0 would), then reg_m relaxes them; 0: relaxed from the first step. Built against the relaxed sizes' seed spread; measured (results.md, session 28): 1 epoch narrowed no spread and cost 1.9 novel points over seven partitions, so every config keeps 0

    def gamma_for(self, num_clusters: int) -> float:
        """The γ a labeler of ``Ku = num_clusters`` uses: ``gamma_per_cluster · Ku`` when that is set, else ``gamma``."""
        return self.gamma_per_cluster * num_clusters if self.gamma_per_cluster > 0 else self.gamma

    def set_gamma(self, gamma: float) -> None:
        """Use ``γ = gamma`` from now on (``gamma_per_cluster`` cleared); :data:`GAMMA_UNIFORM` sets the uniform prior
        instead (γ is then unused). The one place a search or a rehearsal writes its choice of γ."""
        if math.isinf(gamma):
            self.prior = "uniform"
        else:
            self.gamma, self.gamma_per_cluster = float(gamma), 0.0


@dataclass
class MethodConfig:
    """Which discovery method trains the model (``ncdlr.methods``; issue 6): the paper's or a baseline."""

    name: str = "ncdlr"  #: "ncdlr" (ETF + MSE + adaptive self-labeling) | "uno" | "autonovel" (each sets the prototypes and buffer it needs)
    loss: str = "auto"  #: "auto" (ncdlr: mse; uno/autonovel: ce) | "mse" | "ce" — the MSE-vs-CE ablation of ncdlr
    known_loss: str = "auto"  #: loss of the labelled known rows only: "auto" (= method.loss, the paper's one loss for both) | "mse" | "ce" (cross-entropy on cos/T against the same fixed prototypes; MSE's gain is robustness to noisy pseudo-labels, which clean labels do not need)
    known_reweight: float = 0.0  #: q ≥ 0: the labelled known rows' loss weights each row by its class's training count to the power −q, normalised over the batch (Σ w l / Σ w): 1 = class-balanced (each known class counts about equally whatever its count), 0 = off (the paper's mean over rows). The counts come from the training data (observable: known labels only)
    novel_reweight: float = 0.0  #: r ≥ 0: the unlabelled rows' swapped loss weights each row by the size of its target's cluster in the solve that labelled it (the transport's column sums over buffer + batch rows, in rows) to the power −r: a row of soft target q gets Σ_k q_k s_k^(−r), normalised over the batch (Σ w l / Σ w). 1 = balanced over the pseudo-clusters (the novel side of known_reweight: each cluster counts about equally whatever its size), 0 = off (the paper's mean). Needs no label: the sizes are the labeler's own. One head only, no mixup
    temperature: float = 0.1  #: T of cross-entropy logits cos/T (UNO: 0.1)
    task_weight: float = 0.0  #: ≥ 0; > 0 adds this weight × a known-vs-novel cross-entropy on every labelled and unlabelled row (both views): the softmax mass of cos/T over the known columns against the novel ones, with the exact block of each row as target (labelled = known, unlabelled = novel), so no pseudo-label enters it and the classes within a block do not compete. 0 = off (the paper's loss). Against novel images predicted as known classes (results.md, sessions 28–30)
    topk: int = 5  #: autonovel: top-k feature dimensions compared by the ranking statistics
    consistency: float = 0.0  #: autonovel: weight of the two-view MSE between novel probabilities (0 → off)
    posthoc: str = "none"  #: evaluation only: "none" | "la" (logit adjustment by the pseudo-label prior) | "crt" (class-balanced classifier re-training) | "la+crt" (cRT, then LA on its logits)
    crt_epochs: int = 10  #: epochs of the cRT classifier re-training (posthoc crt / la+crt)
