"""ncdlr.methods.mixup: the pairing, the blends, and the mixed loss as the blend of the two sources' losses."""

from __future__ import annotations

import pytest
import torch

from ncdlr.method_settings import LabelerConfig, MethodConfig
from ncdlr.methods import build_method
from ncdlr.methods.mixup import blend, draw_mix


def test_a_pairing_is_drawn_from_its_seed_and_keeps_only_rows_with_two_valid_sources():
    valid = torch.tensor([True, True, False, True, True, True, False, True])
    a, b = draw_mix(valid, 0.4, [3, 17, 0, 1]), draw_mix(valid, 0.4, [3, 17, 0, 1])
    assert a.lam == b.lam and torch.equal(a.perm, b.perm) and torch.equal(a.keep, b.keep)
    assert sorted(a.perm.tolist()) == list(range(8)) and 0.0 <= a.lam <= 1.0
    assert torch.equal(a.keep, valid & valid[a.perm])
    other = draw_mix(valid, 0.4, [3, 18, 0, 1])  # the next step pairs differently
    assert other.lam != a.lam or not torch.equal(other.perm, a.perm)
    with pytest.raises(ValueError, match="α > 0"):
        draw_mix(valid, 0.0, 0)


def test_rows_and_targets_are_blended_with_the_same_lambda_and_partner():
    plan = draw_mix(torch.ones(5, dtype=torch.bool), 1.0, 7)
    x = torch.randn(5, 3, 4, 4)
    expected = torch.stack([plan.lam * x[i] + (1 - plan.lam) * x[plan.perm[i]] for i in range(5)])
    assert torch.allclose(blend(x, plan), expected)
    q = torch.softmax(torch.randn(5, 6), 1)
    blended = blend(q, plan)
    assert torch.allclose(blended.sum(1), torch.ones(5))
    assert torch.allclose(blended[0], plan.lam * q[0] + (1 - plan.lam) * q[plan.perm[0]])


class _Prototypes:
    """A model as the methods see it: unit prototypes ``[D, K]``."""

    num_known, num_novel, learnable_prototypes = 3, 4, False

    def __init__(self):
        self.p = torch.nn.functional.normalize(torch.randn(8, 7), dim=0)

    def class_prototypes(self):
        return self.p

    def logits(self, z):
        return z @ self.p


@pytest.mark.parametrize("loss", ["mse", "ce"])
def test_the_loss_of_a_mixed_row_is_the_blend_of_its_two_sources_losses(loss):
    """Both prototype losses are linear in the soft target, so a row trained towards ``λ y_i + (1 − λ) y_j`` is
    trained towards each label with its weight (the point of mixing the targets with the rows)."""
    method = build_method(MethodConfig(name="ncdlr", loss=loss), LabelerConfig(), 4)
    model = _Prototypes()
    z = torch.nn.functional.normalize(torch.randn(6, 8), dim=1)
    y = torch.tensor([0, 2, 1, 5, 6, 3])
    plan = draw_mix(torch.ones(6, dtype=torch.bool), 0.5, 11)
    onehot = torch.nn.functional.one_hot(y, 7).float()
    p = model.class_prototypes()
    mixed = method.prototype_loss(z, p, blend(onehot, plan))
    split = plan.lam * method.prototype_loss(z, p, onehot) + (1 - plan.lam) * method.prototype_loss(z, p, onehot[plan.perm])
    assert mixed == pytest.approx(float(split), rel=1e-5)


def test_only_soft_pseudo_labels_are_blended_autonovels_pairwise_targets_are_not():
    assert build_method(MethodConfig(name="ncdlr"), LabelerConfig(), 4).soft_novel_targets
    assert build_method(MethodConfig(name="uno"), LabelerConfig(use_buffer=False), 4).soft_novel_targets
    assert not build_method(MethodConfig(name="autonovel"), LabelerConfig(use_buffer=False), 4).soft_novel_targets
