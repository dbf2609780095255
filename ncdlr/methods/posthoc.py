"""Post-hoc logit adjustment (+LA; Menon et al., 2021) with the class prior estimated from pseudo-labels.

``adjusted_k = s_k / T - log π̂_k`` where ``s = z·p`` are the model's cosines and ``π̂`` the class
frequencies: known classes counted from their labels, novel classes from the pseudo-labels the trained
model gives the novel training rows (argmax over the novel columns). A class with zero count has no
estimate and keeps its logit ``s_k / T`` unchanged. ``T`` is the method's temperature (0.1): LA needs
logits on the scale of a softmax classifier, and ``cos/0.1`` is the scale UNO trains.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


def pseudo_label_counts(known_labels: Tensor, novel_logits: Tensor, num_known: int) -> Tensor:
    """Class counts ``[K]``: known labels ``[Nk]`` plus the argmax of ``novel_logits [Nu, Ku]`` (offset by Ks)."""
    num_novel = novel_logits.shape[1]
    counts = torch.bincount(known_labels.long(), minlength=num_known + num_novel)[: num_known + num_novel]
    counts[num_known:] += torch.bincount(novel_logits.argmax(1), minlength=num_novel)
    return counts


def logit_adjustment(logits: Tensor, class_counts: Tensor, temperature: float = 0.1) -> Tensor:
    """``logits [N, K] / T − log π̂`` with ``π̂ = counts / Σ counts``; zero-count classes unchanged.

    Args:
        logits: ``[N, K]`` cosines (or any scores on the scale that ``T`` brings to softmax logits).
        class_counts: ``[K]`` non-negative counts (e.g. :func:`pseudo_label_counts`).
        temperature: ``T > 0``.
    """
    if class_counts.shape != logits.shape[1:] or (class_counts < 0).any() or class_counts.sum() <= 0:
        raise ValueError(f"class_counts must be non-negative [{logits.shape[1]}] with a positive sum, "
                         f"got shape {tuple(class_counts.shape)}")
    counts = class_counts.to(logits.dtype)
    log_prior = torch.where(counts > 0, torch.log(counts.clamp_min(1) / counts.sum()), torch.zeros_like(counts))
    return logits / temperature - log_prior


POSTHOC_CHOICES = ("none", "la", "crt", "la+crt")


@dataclass(frozen=True)
class PosthocFix:
    """A post-hoc fix fitted to a trained model's training rows, to be applied to any new rows' scores.

    Attributes:
        kind: one of :data:`POSTHOC_CHOICES`.
        class_counts: ``[K]`` the prior's counts (known labels + novel pseudo-labels); None for ``none``.
        weights: ``[D, K]`` the re-trained prototypes (``crt``, ``la+crt``), unit columns; None otherwise.
        temperature: ``T`` of :func:`logit_adjustment`.
    """

    kind: str
    class_counts: Tensor | None = None
    weights: Tensor | None = None
    temperature: float = 0.1

    def apply(self, z: Tensor, logits: Tensor) -> Tensor:
        """``[N, K]`` fixed scores of rows with unit embeddings ``z [N, D]`` and the model's scores ``logits [N, K]``
        (their argmax is the prediction); the fix's tensors follow ``z``'s device."""
        if self.kind == "none":
            return logits
        scores = logits if self.weights is None else z @ self.weights.to(z.device, z.dtype)
        if self.kind == "crt":
            return scores
        return logit_adjustment(scores, self.class_counts.to(scores.device), self.temperature)

    def state(self) -> dict:
        """The fix as plain tensors and numbers (``torch.save``-able; :meth:`from_state` reads it back)."""
        return {"kind": self.kind, "class_counts": self.class_counts, "weights": self.weights,
                "temperature": self.temperature}

    @classmethod
    def from_state(cls, state: dict) -> "PosthocFix":
        if state.get("kind") not in POSTHOC_CHOICES:
            raise ValueError(f"not a post-hoc fix: kind {state.get('kind')!r}")
        return cls(state["kind"], state.get("class_counts"), state.get("weights"), float(state["temperature"]))


def fit_posthoc(kind: str, z_known: Tensor, known_labels: Tensor, z_novel: Tensor, novel_logits: Tensor,
                prototypes: Tensor, *, temperature: float = 0.1, crt_epochs: int = 10, seed: int = 0) -> PosthocFix:
    """The fix ``kind`` fitted to the training rows: ``"none"`` (nothing), ``"la"`` (:func:`logit_adjustment` with the
    pseudo-label prior), ``"crt"`` (prototypes ``W`` re-trained by :func:`ncdlr.methods.crt.retrain_classifier` on
    known labels + novel pseudo-labels, scores ``z · W``) or ``"la+crt"`` (cRT, then LA on its scores, same prior).

    Args:
        z_known, known_labels: ``[Nk, D]`` embeddings and ``[Nk]`` labels of the known training rows.
        z_novel, novel_logits: ``[Nu, D]`` embeddings and ``[Nu, Ku]`` novel-column scores of the novel
            training rows (pseudo-label = argmax).
        prototypes: ``[D, K]`` the trained prototypes (cRT's starting point).
    """
    if kind not in POSTHOC_CHOICES:
        raise ValueError(f"posthoc must be one of {', '.join(POSTHOC_CHOICES)}, got {kind!r}")
    if kind == "none":
        return PosthocFix("none", temperature=temperature)
    num_known = prototypes.shape[1] - novel_logits.shape[1]
    counts = pseudo_label_counts(known_labels, novel_logits, num_known)
    if kind == "la":
        return PosthocFix("la", counts, None, temperature)
    from .crt import retrain_classifier

    labels = torch.cat([known_labels.long(), num_known + novel_logits.argmax(1)])
    weights = retrain_classifier(torch.cat([z_known, z_novel]), labels, prototypes.detach(), epochs=crt_epochs,
                                 temperature=temperature, seed=seed)
    return PosthocFix(kind, counts, weights, temperature)


def posthoc_scores(kind: str, z_test: Tensor, test_logits: Tensor, z_known: Tensor, known_labels: Tensor,
                   z_novel: Tensor, novel_logits: Tensor, prototypes: Tensor, *, temperature: float = 0.1,
                   crt_epochs: int = 10, seed: int = 0) -> Tensor:
    """``[N, K]`` test scores after the post-hoc fix ``kind`` (:func:`fit_posthoc` on the training rows, then
    :meth:`PosthocFix.apply` to ``z_test [N, D]`` and the trained model's ``test_logits [N, K]``); their argmax is the
    prediction."""
    fix = fit_posthoc(kind, z_known, known_labels, z_novel, novel_logits, prototypes, temperature=temperature,
                      crt_epochs=crt_epochs, seed=seed)
    return fix.apply(z_test, test_logits)
