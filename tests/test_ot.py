"""Sinkhorn solvers: POT agreement, marginals, stability at small ε, the rescaled-kernel solver (method.md §4.2)."""

import warnings

import numpy as np
import ot
import pytest
import torch

from ncdlr.ot import ScaledKernel, sinkhorn


def _problem(seed: int, n: int = 40, k: int = 9, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    scores = torch.rand(n, k, generator=g, dtype=dtype) * 2 - 1
    marginal = torch.rand(k, generator=g, dtype=dtype) + 0.05
    return scores, marginal / marginal.sum()


@pytest.mark.parametrize("n_iters", [1, 3, 10])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("eps", [0.05, 0.2])
def test_sinkhorn_equals_pot_iteration_for_iteration(n_iters, seed, eps):
    scores, marginal = _problem(seed)
    n = scores.shape[0]
    ours = sinkhorn(scores, marginal, eps, n_iters).numpy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # POT warns that 1-10 iterations did not converge
        ref = n * ot.sinkhorn(np.full(n, 1.0 / n), marginal.numpy(), -scores.numpy(), eps, numItermax=n_iters, stopThr=0)
    np.testing.assert_allclose(ours, ref, rtol=1e-6, atol=1e-12)


def test_rows_are_distributions_and_both_marginals_hold_after_many_iterations():
    scores, marginal = _problem(5)
    q = sinkhorn(scores, marginal, eps=0.1, n_iters=2000)
    torch.testing.assert_close(q.sum(1), torch.ones(q.shape[0], dtype=q.dtype))
    torch.testing.assert_close(q.sum(0) / q.shape[0], marginal, atol=1e-8, rtol=0)


def test_fixed_point_equations_hold_at_convergence():
    scores, marginal = _problem(6)
    eps = 0.1
    q = sinkhorn(scores, marginal, eps, n_iters=3000)
    # Y = diag(u) K diag(v): log Y - S/eps must be a sum of a row and a column potential.
    residual = torch.log(q) - scores / eps
    centred = residual - residual.mean(1, keepdim=True) - residual.mean(0, keepdim=True) + residual.mean()
    assert centred.abs().max() < 1e-8


def test_small_eps_on_cosines_stays_finite_where_the_linear_domain_breaks():
    scores, marginal = _problem(7, n=256, k=50, dtype=torch.float32)
    eps = 0.01
    linear_kernel = torch.exp(scores / eps)  # what a linear-domain Sinkhorn would form
    assert not torch.isfinite(linear_kernel).all() or (linear_kernel == 0).any()
    q = sinkhorn(scores, marginal, eps, n_iters=3)
    assert torch.isfinite(q).all()
    reference = sinkhorn(scores.double(), marginal.double(), eps, n_iters=3)
    torch.testing.assert_close(q.double(), reference, atol=1e-4, rtol=0)


def test_sinkhorn_is_differentiable_in_the_column_marginal():
    scores, marginal = _problem(8)
    marginal = marginal.clone().requires_grad_(True)
    (sinkhorn(scores, marginal, 0.1, 3) * scores).sum().backward()
    assert marginal.grad is not None and torch.isfinite(marginal.grad).all()
    assert marginal.grad.abs().sum() > 0


@pytest.mark.parametrize("eps", [0.01, 0.05])
@pytest.mark.parametrize("n_iters", [1, 3, 7])
def test_scaled_kernel_fast_path_equals_the_log_domain_solver(eps, n_iters):
    scores, marginal = _problem(9, n=300, k=30)
    kernel = ScaledKernel.from_scores(scores, eps)
    fast = kernel.rows(kernel.column_scaling(marginal, n_iters))
    torch.testing.assert_close(fast, sinkhorn(scores, marginal, eps, n_iters), atol=1e-10, rtol=1e-8)
    gain = kernel.transport_gain(kernel.column_scaling(marginal, n_iters))
    torch.testing.assert_close(gain, (fast * scores).sum(1).mean())


def test_scaled_kernel_float32_at_eps_001_matches_float64():
    scores, marginal = _problem(10, n=2048, k=200, dtype=torch.float32)
    kernel = ScaledKernel.from_scores(scores, 0.01)
    fast = kernel.rows(kernel.column_scaling(marginal, 3))
    assert torch.isfinite(fast).all()
    reference = sinkhorn(scores.double(), marginal.double(), 0.01, 3)
    torch.testing.assert_close(fast.double(), reference, atol=1e-4, rtol=0)
