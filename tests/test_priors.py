"""Cluster-size priors: the parametric profile, soft-mass ranks, and one interface for every prior (method.md §4.3)."""

import math

import numpy as np
import pytest
import torch

from ncdlr.priors import (
    PRIORS,
    AdaptivePrior,
    AnchoredPrior,
    BoundedPrior,
    FixedPrior,
    FreePrior,
    ScalarPrior,
    UniformPrior,
    build_prior,
    cluster_prior,
    kl_from_uniform,
    rank_by_mass,
)

K = 12
RANKS = torch.arange(K)  # rank_of_cluster = identity: the marginal comes back in rank order


def test_cluster_prior_is_a_descending_distribution_with_ratio_tau():
    for t in (-3.0, 0.0, 2.5):
        w = cluster_prior(torch.tensor(t, dtype=torch.float64), 25)
        torch.testing.assert_close(w.sum(), torch.tensor(1.0, dtype=torch.float64))
        assert (w[1:] <= w[:-1]).all()
        torch.testing.assert_close(w[0] / w[-1], torch.tensor(1 + np.exp(t), dtype=torch.float64))


def test_cluster_prior_tends_to_uniform_as_t_goes_to_minus_infinity():
    w = cluster_prior(torch.tensor(-60.0), 10)
    torch.testing.assert_close(w, torch.full((10,), 0.1))
    assert float(kl_from_uniform(w)) == pytest.approx(0.0, abs=1e-6)


def test_rank_by_mass_gives_rank_zero_to_the_largest_cluster():
    rank = rank_by_mass(torch.tensor([0.5, 3.0, -1.0, 2.0]))
    assert rank.tolist() == [2, 0, 3, 1]


def every_prior() -> list:
    sizes = torch.linspace(5.0, 1.0, K)[torch.randperm(K, generator=torch.Generator().manual_seed(0))]
    return [UniformPrior(K), FixedPrior(K, sizes), FreePrior(K), AdaptivePrior(K, init_t=0.7),
            BoundedPrior(K, max_imbalance=30.0, init_t=0.7), AnchoredPrior(K, max_imbalance=20.0, init_t=0.7)]


@pytest.mark.parametrize("prior", every_prior(), ids=lambda p: p.kind)
def test_marginal_is_a_distribution_over_the_clusters(prior):
    w = prior.marginal(RANKS)
    assert w.shape == (K,) and (w > 0).all()
    torch.testing.assert_close(w.sum(), torch.tensor(1.0))


@pytest.mark.parametrize("prior", [p for p in every_prior() if p.kind != "free"], ids=lambda p: p.kind)
def test_ranked_priors_are_non_increasing_in_rank_and_follow_the_ranking(prior):
    in_rank_order = prior.marginal(RANKS)
    assert (in_rank_order[1:] <= in_rank_order[:-1]).all()
    ranking = torch.randperm(K, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(prior.marginal(ranking), in_rank_order[ranking])


@pytest.mark.parametrize("prior", every_prior(), ids=lambda p: p.kind)
def test_imbalance_factor_is_the_ratio_of_largest_to_smallest_size(prior):
    w = prior.marginal(RANKS).detach()
    assert prior.imbalance_factor(w) == pytest.approx(float(w.max() / w.min()), rel=1e-5)


@pytest.mark.parametrize("prior", every_prior(), ids=lambda p: p.kind)
def test_a_prior_learns_exactly_when_it_has_parameters(prior):
    assert prior.learns == any(True for _ in prior.parameters())
    assert prior.learns == (prior.kind not in ("uniform", "fixed"))


@pytest.mark.parametrize("prior", [UniformPrior(K), FixedPrior(K, torch.full((K,), 3.0)), FreePrior(K),
                                   AdaptivePrior(K, init_t=-60.0), BoundedPrior(K, max_imbalance=30.0, init_t=-20.0)],
                         ids=lambda p: p.kind)
def test_divergence_from_uniform_is_zero_at_the_uniform_marginal(prior):
    assert float(prior.divergence(prior.marginal(RANKS)).detach()) == pytest.approx(0.0, abs=1e-6)


def test_anchored_divergence_is_zero_at_the_anchor_and_positive_elsewhere():
    prior = AnchoredPrior(K, max_imbalance=20.0, init_t=math.log(20.0 - 1.0))  # τ = τ̂
    ranking = torch.randperm(K, generator=torch.Generator().manual_seed(2))
    assert float(prior.divergence(prior.marginal(ranking)).detach()) == pytest.approx(0.0, abs=1e-6)  # any ranking
    assert float(prior.divergence(AnchoredPrior(K, max_imbalance=20.0).marginal(ranking)).detach()) > 1e-3
    assert prior.imbalance_factor(prior.marginal(RANKS)) == pytest.approx(20.0)


def test_bounded_prior_starts_inside_its_bound_and_never_exceeds_it():
    prior = BoundedPrior(K, max_imbalance=8.0, init_t=50.0)  # 1 + e^50 is clipped to halfway, τ₀ = 4.5
    assert prior.imbalance_factor(prior.marginal(RANKS)) == pytest.approx(4.5)
    for t in (-5.0, 0.0, 5.0, 40.0):
        with torch.no_grad():
            prior.t.fill_(t)
        w = prior.marginal(RANKS).detach()
        assert 1.0 < float(w[0] / w[-1]) <= 8.0 + 1e-5


@pytest.mark.parametrize("prior", [AdaptivePrior(K, init_t=0.7), BoundedPrior(K, max_imbalance=30.0, init_t=0.7),
                                   AnchoredPrior(K, max_imbalance=20.0, init_t=0.7)], ids=lambda p: p.kind)
def test_scalar_prior_gives_log_tau_and_the_divergence_slope_that_autograd_gives(prior):
    """What the forward-mode path uses: ``s = log τ``, ``ds/dt`` and ``d divergence/ds`` equal autograd in ``t``."""
    prior = prior.double()
    s, ds_dt = prior.log_tau(torch.float64)
    ranked = prior.ranked()
    assert float(s) == pytest.approx(math.log(prior.imbalance_factor(ranked.detach())), rel=1e-12)
    (ds_dt_autograd,) = torch.autograd.grad(torch.log(ranked[0] / ranked[-1]), prior.t)
    assert float(ds_dt) == pytest.approx(float(ds_dt_autograd), rel=1e-10)
    (d_divergence,) = torch.autograd.grad(prior.divergence(prior.marginal(RANKS)), prior.t)
    ranked = ranked.detach()
    rho = prior.relative_ranks(ranked)
    slope = prior.divergence_slope(ranked, rho, (ranked * rho).sum())
    assert float(slope * ds_dt) == pytest.approx(float(d_divergence), rel=1e-10)


def test_registry_builds_every_kind_by_name():
    assert set(PRIORS) == {"adaptive", "uniform", "fixed", "free", "bounded", "anchored"}
    for kind, cls in PRIORS.items():
        prior = build_prior(kind, K, init_t=0.0, fixed_prior=torch.ones(K), max_imbalance=10.0)
        assert type(prior) is cls and prior.kind == kind
        assert isinstance(prior, ScalarPrior) == (kind in ("adaptive", "bounded", "anchored"))


def test_scalar_priors_start_at_tau_one_plus_exp_init_t():
    for kind in ("adaptive", "bounded", "anchored"):
        prior = build_prior(kind, K, init_t=0.5, max_imbalance=30.0)
        assert prior.imbalance_factor(prior.marginal(RANKS)) == pytest.approx(1 + math.exp(0.5))


@pytest.mark.parametrize(
    ("kind", "options", "message"),
    [
        ("zipf", {}, "prior must be adaptive|uniform|fixed|free|bounded|anchored"),
        ("fixed", {}, r"prior='fixed' needs fixed_prior: non-negative \[12\]"),
        ("fixed", {"fixed_prior": torch.ones(3)}, "fixed_prior"),
        ("fixed", {"fixed_prior": -torch.ones(K)}, "fixed_prior"),
        ("bounded", {}, "prior='bounded' needs max_imbalance > 1"),
        ("anchored", {"max_imbalance": 1.0}, "prior='anchored' needs max_imbalance > 1"),
    ],
)
def test_bad_prior_options_are_a_clear_error(kind, options, message):
    with pytest.raises(ValueError, match=message):
        build_prior(kind, K, **options)
