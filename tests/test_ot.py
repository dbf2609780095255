"""Sinkhorn solvers: POT agreement, marginals, stability at small ε, the rescaled-kernel solver (method.md §4.2)."""

import warnings

import numpy as np
import ot
import pytest
import torch

from ncdlr.ot import ScaledKernel, capped_shares, sinkhorn, size_exponent


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


@pytest.mark.parametrize("reg_m", [0.02, 0.45])
def test_relaxed_sizes_equal_pot_semi_relaxed_ot_at_convergence(reg_m):
    """``reg_m > 0``: exact rows, the column marginal pulled towards ``w`` by ``reg_m · KL`` — POT's
    ``sinkhorn_unbalanced`` with ``reg_m = (inf, reg_m)`` and the plain entropy as regulariser (``reg_type =
    "entropy"``, ours; POT's default is the KL to ``a bᵀ``), rows rescaled to sum 1, for both solvers."""
    scores, marginal = _problem(11, n=120, k=6)
    scores[:80, 0] += 0.5  # one cluster the scores want larger than w gives it
    eps = 0.05
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan = ot.unbalanced.sinkhorn_unbalanced(np.full(120, 1 / 120), marginal.numpy(), -scores.numpy(), eps,
                                                 (float("inf"), reg_m), reg_type="entropy", numItermax=20000,
                                                 stopThr=1e-13)
    reference = torch.from_numpy(plan / plan.sum(1, keepdims=True))
    torch.testing.assert_close(sinkhorn(scores, marginal, eps, 3000, reg_m=reg_m), reference, atol=1e-7, rtol=0)
    kernel = ScaledKernel.from_scores(scores, eps)
    fast = kernel.rows(kernel.column_scaling(marginal, 3000, size_exponent(reg_m, eps)))
    torch.testing.assert_close(fast, reference, atol=1e-7, rtol=0)
    exact = sinkhorn(scores, marginal, eps, 3000)
    assert exact.mean(0)[0] == pytest.approx(float(marginal[0]), abs=1e-6)
    assert reference.mean(0)[0] > exact.mean(0)[0] + 0.02  # the cluster the scores favour is let grow


@pytest.mark.parametrize("eps", [0.01, 0.05])
@pytest.mark.parametrize("n_iters", [1, 3])
def test_relaxed_scaled_kernel_equals_the_log_domain_solver(eps, n_iters):
    """The truncated relaxed solve (the labeler's ``T = 3``) is the same plan in both solvers."""
    scores, marginal = _problem(12, n=300, k=30)
    kernel = ScaledKernel.from_scores(scores, eps)
    kappa = size_exponent(0.1, eps)
    fast = kernel.rows(kernel.column_scaling(marginal, n_iters, kappa))
    torch.testing.assert_close(fast, sinkhorn(scores, marginal, eps, n_iters, reg_m=0.1), atol=1e-10, rtol=1e-8)


def test_size_exponent_is_one_without_relaxation_and_refuses_a_negative_weight():
    assert size_exponent(0.0, 0.05) == 1.0
    assert size_exponent(0.45, 0.05) == pytest.approx(0.9)
    with pytest.raises(ValueError, match="reg_m >= 0"):
        size_exponent(-1.0, 0.05)


def test_relaxed_sizes_towards_the_uniform_marginal_solve_the_papers_relaxed_ot_with_w_free():
    """The paper's relaxed OT (eq. 3–4): ``min over Y and w of ⟨Y, -S⟩ - ε H(Y) + ρ KL(w ‖ ν)`` with ``Y 1 = μ``,
    ``Yᵀ 1 = w`` and ``ν`` uniform. Eliminating ``w = Yᵀ1`` leaves the semi-relaxed problem towards ``ν``, so one
    relaxed Sinkhorn solve (``reg_m = ρ``, uniform marginal) is its exact solution. Checked against the paper's
    bi-level reading solved independently: POT's balanced Sinkhorn for each ``w`` (the inner problem) and an outer
    minimisation over the simplex (scipy, ``w = softmax(θ)``); both find the same sizes and the same plan."""
    from scipy.optimize import minimize

    scores, _ = _problem(13, n=12, k=4)
    scores[:7, 0] += 0.4  # long-tailed demand: most rows favour cluster 0
    s, n, k, eps, rho = scores.double().numpy(), 12, 4, 0.2, 0.5
    uniform = np.full(k, 1 / k)

    def inner(w: np.ndarray) -> tuple[float, np.ndarray]:
        plan = ot.sinkhorn(np.full(n, 1 / n), w, -s, eps, numItermax=100000, stopThr=1e-13)
        return float((plan * -s).sum() + eps * (plan * np.log(plan)).sum()), plan

    def simplex(theta: np.ndarray) -> np.ndarray:
        w = np.exp(theta - theta.max())
        return w / w.sum()

    def outer(theta: np.ndarray) -> float:
        w = simplex(theta)
        return inner(w)[0] + rho * float((w * np.log(w / uniform)).sum())

    options = {"xatol": 1e-9, "fatol": 1e-13, "maxiter": 20000}
    w_star = simplex(minimize(outer, np.zeros(k), method="Nelder-Mead", options=options).x)
    relaxed = sinkhorn(scores.double(), torch.full((k,), 1 / k, dtype=torch.float64), eps, 5000, reg_m=rho) / n
    np.testing.assert_allclose(relaxed.sum(0).numpy(), w_star, atol=1e-4)
    np.testing.assert_allclose(relaxed.numpy(), inner(w_star)[1], atol=1e-4)
    assert w_star[0] > 1.2 / k  # the sizes followed the scores, away from ν (0.33 against 0.25)


def test_capped_shares_is_the_kl_projection_onto_the_bounded_simplex():
    """``clip(λ q, low, high)`` summing to 1: shares inside the bounds keep their ratios, the rest sit on a bound;
    shares already inside come back unchanged, whatever the scale of the sizes."""
    sizes = torch.tensor([70.0, 20.0, 9.0, 1.0])
    p = capped_shares(sizes, 0.05, 0.6)
    torch.testing.assert_close(p, torch.tensor([0.6, 0.35 * 20 / 29, 0.35 * 9 / 29, 0.05]))
    torch.testing.assert_close(capped_shares(sizes, 0.0, 1.0), sizes / 100)
    torch.testing.assert_close(capped_shares(torch.tensor([1e-30, 1.0, 1.0]), 0.1, 1.0), torch.tensor([0.1, 0.45, 0.45]))
    with pytest.raises(ValueError, match="cannot hold shares of 4 clusters"):
        capped_shares(sizes, 0.3, 0.9)  # four shares of at least 0.3 cannot sum to 1


def test_bounded_relaxed_sizes_solve_the_relaxed_ot_with_the_sizes_held_in_their_bounds():
    """``bounds``: the relaxed problem of the test above with ``low ≤ Yᵀ1 ≤ high`` added. Without bounds the sizes
    leave them on both sides; with them the solver holds the favoured cluster at ``high`` and the starved one at
    ``low``, and the rest is the optimum on that face (scipy's bounded scalar minimisation, POT's balanced Sinkhorn
    inside), which no other feasible size vector beats (the problem is convex). The truncated solves of the
    log-domain and rescaled-kernel solvers agree step for step."""
    from scipy.optimize import minimize_scalar

    scores, _ = _problem(13, n=12, k=4)
    scores[:7, 0] += 0.4  # most rows favour cluster 0 ...
    scores[:, 3] -= 0.3  # ... and none cluster 3
    s, n, k, eps, rho, low, high = scores.double().numpy(), 12, 4, 0.2, 0.5, 0.2, 0.3

    def objective(w: np.ndarray) -> float:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            plan = ot.sinkhorn(np.full(n, 1 / n), w, -s, eps, numItermax=20000, stopThr=1e-12)
        return float((plan * -s).sum() + eps * (plan * np.log(plan)).sum() + rho * (w * np.log(w * k)).sum())

    marginal = torch.full((k,), 1 / k, dtype=torch.float64)
    free = sinkhorn(scores.double(), marginal, eps, 5000, reg_m=rho).mean(0)  # the test above: the unbounded optimum
    assert free[0] > high + 0.04 and free[3] < low - 0.04  # (0.35 and 0.155): without bounds both leave them
    bounded = sinkhorn(scores.double(), marginal, eps, 5000, reg_m=rho, bounds=(low, high)).mean(0).numpy()
    assert bounded[0] == pytest.approx(high, abs=1e-6) and bounded[3] == pytest.approx(low, abs=1e-6)

    def on_face(w1: float) -> np.ndarray:
        return np.array([high, w1, 1 - high - low - w1, low])

    face = minimize_scalar(lambda w1: objective(on_face(w1)), bounds=(low, high), method="bounded",
                           options={"xatol": 1e-9})
    np.testing.assert_allclose(bounded, on_face(face.x), atol=1e-5)
    rng = np.random.default_rng(0)
    others = [w for w in rng.dirichlet(np.full(k, 5.0), 4000) if ((w >= low) & (w <= high)).all()][:10]
    assert len(others) == 10 and min(objective(w) for w in others) >= objective(bounded) - 1e-9
    kernel = ScaledKernel.from_scores(scores.double(), eps)
    for n_iters in (1, 3, 50):
        fast = kernel.rows(kernel.column_scaling(marginal, n_iters, size_exponent(rho, eps), (low, high)))
        torch.testing.assert_close(fast, sinkhorn(scores.double(), marginal, eps, n_iters, reg_m=rho,
                                                  bounds=(low, high)), atol=1e-10, rtol=1e-8)


def test_size_bounds_refuse_held_sizes():
    scores, marginal = _problem(14, n=20, k=4)
    with pytest.raises(ValueError, match="need reg_m > 0"):
        sinkhorn(scores, marginal, 0.1, 3, bounds=(0.1, 0.5))
    with pytest.raises(ValueError, match="need reg_m > 0"):
        ScaledKernel.from_scores(scores, 0.1).column_scaling(marginal, 3, 1.0, (0.1, 0.5))
