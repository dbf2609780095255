"""Long-tail profiles and the known/novel split (method.md §1)."""

import pytest

from ncdlr.data.longtail import long_tail_counts, split_known_novel


def test_counts_follow_the_exponential_formula_from_head_to_tail():
    counts = long_tail_counts(500, 50, 50)
    assert counts[0] == 500 and counts[-1] == 10
    assert all(a >= b for a, b in zip(counts, counts[1:]))


def test_paper_sizes_for_cifar100_50_50():
    assert sum(long_tail_counts(500, 50, 50)) == 6369  # paper: known 6.4k
    assert sum(long_tail_counts(500, 50, 100)) == 5499  # paper: novel 5.5k at R = 100


def test_split_is_seeded_disjoint_and_ceil_half_known():
    known, novel = split_known_novel(683, seed=0)
    assert len(known) == 342 and len(novel) == 341  # Herbarium19: 342 known
    assert sorted(known + novel) == list(range(683))
    assert split_known_novel(683, seed=0) == (known, novel)
    assert split_known_novel(683, seed=1) != (known, novel)


@pytest.mark.parametrize(("args", "message"), [((0, 5, 2), "n_max"), ((10, 5, 0.5), "imbalance_ratio")])
def test_bad_profiles_are_clear_errors(args, message):
    with pytest.raises(ValueError, match=message):
        long_tail_counts(*args)
