"""Simplex ETF geometry (method.md §2)."""

import pytest
import torch

from ncdlr.prototypes import simplex_etf


@pytest.mark.parametrize(("dim", "k"), [(2, 3), (9, 10), (10, 10), (64, 10), (100, 100), (512, 40)])
def test_columns_are_unit_norm_with_pairwise_cosine_minus_one_over_k_minus_one(dim, k):
    p = simplex_etf(dim, k, seed=3).double()
    assert p.shape == (dim, k)
    gram = p.T @ p
    expected = torch.full((k, k), -1.0 / (k - 1), dtype=torch.float64)
    expected.fill_diagonal_(1.0)
    torch.testing.assert_close(gram, expected, atol=1e-5, rtol=0)


def test_prototypes_sum_to_zero_like_a_centred_simplex():
    p = simplex_etf(32, 12).double()
    assert p.sum(dim=1).abs().max() < 1e-5


def test_same_seed_same_prototypes_other_seed_other_rotation():
    a, b, c = simplex_etf(16, 8, seed=1), simplex_etf(16, 8, seed=1), simplex_etf(16, 8, seed=2)
    assert torch.equal(a, b)
    assert not torch.allclose(a, c)


def test_dim_below_k_minus_one_is_a_clear_error():
    with pytest.raises(ValueError, match="dim >= num_classes - 1"):
        simplex_etf(8, 10)


def test_single_class_is_rejected():
    with pytest.raises(ValueError, match="num_classes >= 2"):
        simplex_etf(8, 1)
