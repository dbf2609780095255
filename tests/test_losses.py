"""Prototype losses (method.md §3)."""

import pytest
import torch
import torch.nn.functional as F

from ncdlr.losses import class_balance_weights, known_novel_cross_entropy, prototype_cross_entropy, prototype_mse
from ncdlr.prototypes import simplex_etf


def unit(n: int, d: int, seed: int = 0) -> torch.Tensor:
    return F.normalize(torch.randn(n, d, generator=torch.Generator().manual_seed(seed)), dim=1)


def test_mse_equals_two_minus_two_cosine_for_unit_vectors():
    z, p = unit(16, 12), simplex_etf(12, 6)
    y = torch.arange(16) % 6
    expected = (2 - 2 * (z * p[:, y].T).sum(1)).mean()
    torch.testing.assert_close(prototype_mse(z, p, y), expected)


def test_one_hot_soft_targets_equal_hard_targets():
    z, p = unit(10, 8), simplex_etf(8, 5)
    y = torch.arange(10) % 5
    torch.testing.assert_close(prototype_mse(z, p, F.one_hot(y, 5).float()), prototype_mse(z, p, y))
    torch.testing.assert_close(prototype_cross_entropy(z, p, F.one_hot(y, 5).float()), prototype_cross_entropy(z, p, y))


def test_soft_targets_average_the_squared_distances():
    z, p = unit(4, 8), simplex_etf(8, 3)
    q = torch.tensor([[0.5, 0.5, 0.0]] * 4)
    expected = 0.5 * prototype_mse(z, p, torch.zeros(4, dtype=torch.long)) + 0.5 * prototype_mse(z, p, torch.ones(4, dtype=torch.long))
    torch.testing.assert_close(prototype_mse(z, p, q), expected)


def test_mse_is_zero_on_the_prototype_and_gradients_flow_to_z():
    p = simplex_etf(8, 4)
    z = p.T.clone().requires_grad_(True)
    loss = prototype_mse(z, p, torch.arange(4))
    assert float(loss.detach()) == pytest.approx(0.0, abs=1e-6)
    prototype_mse(z, p, torch.tensor([1, 2, 3, 0])).backward()
    assert z.grad.abs().sum() > 0


def test_bad_targets_are_clear_errors():
    z, p = unit(4, 8), simplex_etf(8, 3)
    with pytest.raises(ValueError, match=r"hard targets must lie in \[0, 3\)"):
        prototype_mse(z, p, torch.tensor([0, 1, 2, 3]))
    with pytest.raises(ValueError, match=r"soft targets must be \[N, K\]"):
        prototype_mse(z, p, torch.zeros(4, 5))


def test_known_novel_cross_entropy_is_the_binary_cross_entropy_of_the_blocks_softmax_mass():
    """By hand: p(novel) = the softmax mass of the novel columns; the loss is −log of the own block's mass."""
    z, p = unit(12, 10), simplex_etf(10, 7)
    is_novel = torch.arange(12) % 3 == 0
    probs = torch.softmax(z @ p / 0.1, dim=1)
    p_novel = probs[:, 3:].sum(1)
    expected = -torch.where(is_novel, p_novel, 1 - p_novel).log().mean()
    torch.testing.assert_close(known_novel_cross_entropy(z, p, 3, is_novel, 0.1), expected)


def test_known_novel_cross_entropy_does_not_make_the_classes_of_a_block_compete():
    """Moving a novel row from one novel prototype to another leaves the loss unchanged (an ETF treats every
    column alike), whereas a novel row on a known prototype costs more than one on a novel prototype."""
    p = simplex_etf(8, 6)
    on = p.T.clone()  # row k sits on prototype k
    novel = torch.ones(1, dtype=torch.bool)
    at_3, at_5 = (known_novel_cross_entropy(on[k:k + 1], p, 2, novel) for k in (3, 5))
    at_known = known_novel_cross_entropy(on[0:1], p, 2, novel)
    torch.testing.assert_close(at_3, at_5)
    assert float(at_known) > float(at_3) + 1.0


def test_known_novel_cross_entropy_refuses_a_wrong_known_count_or_mask_and_is_zero_on_no_rows():
    z, p = unit(4, 8), simplex_etf(8, 5)
    with pytest.raises(ValueError, match="num_known"):
        known_novel_cross_entropy(z, p, 5, torch.zeros(4, dtype=torch.bool))
    with pytest.raises(ValueError, match="is_novel"):
        known_novel_cross_entropy(z, p, 2, torch.zeros(3, dtype=torch.bool))
    empty = known_novel_cross_entropy(z[:0], p, 2, torch.zeros(0, dtype=torch.bool))
    assert float(empty) == 0.0


def test_row_weights_give_the_weighted_mean_and_none_or_equal_weights_the_plain_mean():
    z, p = unit(6, 8, 1), simplex_etf(8, 4, seed=0)
    y = torch.tensor([0, 0, 1, 2, 3, 3])
    w = torch.tensor([0.5, 0.5, 2.0, 1.0, 0.0, 3.0])
    for loss in (prototype_mse, prototype_cross_entropy):
        per_row = torch.stack([loss(z[i:i + 1], p, y[i:i + 1]) for i in range(6)])
        torch.testing.assert_close(loss(z, p, y, weights=w), (w * per_row).sum() / w.sum())
        torch.testing.assert_close(loss(z, p, y, weights=torch.full((6,), 7.0)), loss(z, p, y))
        with pytest.raises(ValueError, match=r"weights must be \[N\] = \[6\]"):
            loss(z, p, y, weights=w[:5])


def test_class_balanced_weights_count_each_class_equally_over_a_batch_drawn_at_the_training_shares():
    counts = torch.tensor([6.0, 2.0, 1.0])
    weights = class_balance_weights(counts, 1.0)
    torch.testing.assert_close(weights, torch.tensor([1 / 6, 1 / 2, 1.0]))
    torch.testing.assert_close(class_balance_weights(counts, 0.0), torch.ones(3))
    torch.testing.assert_close(class_balance_weights(counts, 0.5), (counts ** -0.5) / (counts ** -0.5).max())
    # a batch with the training shares (6:2:1): the weighted mean is the mean over classes of each class's mean
    z, p = unit(9, 8, 2), simplex_etf(8, 3, seed=1)
    y = torch.tensor([0] * 6 + [1] * 2 + [2])
    per_row = torch.stack([prototype_mse(z[i:i + 1], p, y[i:i + 1]) for i in range(9)])
    class_means = torch.stack([per_row[y == c].mean() for c in range(3)])
    torch.testing.assert_close(prototype_mse(z, p, y, weights=weights[y]), class_means.mean())


def test_class_balance_weights_refuse_a_negative_power_and_counts_with_no_row():
    assert class_balance_weights(torch.tensor([4.0, 0.0, 2.0]), 1.0).tolist() == [0.5, 0.0, 1.0]
    with pytest.raises(ValueError, match="power must be >= 0"):
        class_balance_weights(torch.tensor([1.0, 2.0]), -1.0)
    with pytest.raises(ValueError, match="power must be >= 0"):
        class_balance_weights(torch.tensor([1.0, 2.0]), float("nan"))
    for bad in (torch.tensor([0.0, 0.0]), torch.tensor([3.0, -1.0]), torch.ones(2, 2)):
        with pytest.raises(ValueError, match="non-negative training counts"):
            class_balance_weights(bad, 1.0)
