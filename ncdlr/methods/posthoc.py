"""Post-hoc logit adjustment (+LA; Menon et al., 2021) with the class prior estimated from pseudo-labels.

``adjusted_k = s_k / T - log π̂_k`` where ``s = z·p`` are the model's cosines and ``π̂`` the class
frequencies: known classes counted from their labels, novel classes from the pseudo-labels the trained
model gives the novel training rows (argmax over the novel columns). A class with zero count has no
estimate and keeps its logit ``s_k / T`` unchanged. ``T`` is the method's temperature (0.1): LA needs
logits on the scale of a softmax classifier, and ``cos/0.1`` is the scale UNO trains.
"""

from __future__ import annotations

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
