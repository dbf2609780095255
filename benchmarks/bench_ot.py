"""One adaptive pseudo-labeling step at the paper's iNat18-2K size, ours vs POT and vs a plain version.

Problem: N = 2048 buffer rows + 128 batch rows, Ku = 1000 novel clusters, L = 10 alternations of
T = 3 Sinkhorn iterations and one SGD step on t, ε = 0.05, float32 (method.md §4).

Contenders (same arithmetic, measured in the same run):
  ours   — ncdlr.labeler.AdaptiveSelfLabeler: kernel rescaled once per call (ncdlr.ot.ScaledKernel, one exp pass),
           matvec Sinkhorn, dF/dt in forward mode (ncdlr.labeler_fast: the tangent rides along each Sinkhorn
           update; no autograd graph).
  ours, relaxed sizes — the same labeler with ``reg_m = 0.45`` (semi-relaxed OT: each column update raised to a power
           and rescaled, one pow and one exp per Sinkhorn half-step): what the option adds to a step.
  ours, uniform prior, relaxed sizes (+ floor) — the paper's relaxed OT solved exactly (one solve, nothing learned),
           without and with ``size_floor`` = half of 1/Ku: the floor's cost is the second over the first
           (:func:`ncdlr.ot.capped_shares`, 60 bisection steps on a [Ku] vector per column update).
  ours, autograd dF/dt — the same labeler with ``forward_mode = False``: reverse-mode autograd through the
           T iterations (the previous implementation), to show what the forward mode buys.
  plain  — log-domain Sinkhorn (ncdlr.ot.sinkhorn, logsumexp passes) with autograd, L times per step.
  POT    — ot.sinkhorn on NumPy (POT's Sinkhorn-Knopp), dF/dt by a forward finite difference
           (two solves per alternation), L times per step.

Usage:  .venv/bin/python benchmarks/bench_ot.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import numpy as np
import ot
import torch

from ncdlr.labeler import AdaptiveSelfLabeler
from ncdlr.ot import sinkhorn
from ncdlr.priors import cluster_prior, kl_from_uniform, rank_by_mass

N, K, L, T, EPS, GAMMA, LR = 2048 + 128, 1000, 10, 3, 0.05, 500.0, 0.1
RELAXED_REG_M = 0.45  #: the quality benchmark's relaxed variants (benchmarks/quality.py RELAX_REG_M)


def interleaved_seconds(steps: dict, rounds: int, pause: float) -> dict[str, list[float]]:
    """Seconds per call of each contender, measured round-robin so that load drifts hit all of them alike.

    ``pause`` seconds of sleep precede every timed call: NumPy's OpenBLAS threads keep spinning on the cores
    for a while after POT's last matrix product (and torch's OpenMP threads after ours), which would slow
    whichever contender runs next on a 2-core machine.
    """
    for step in steps.values():
        step()  # warm-up
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            time.sleep(pause)
            start = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - start)
    return times


def plain_step(scores: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """The straightforward version: log-domain Sinkhorn + autograd, plain SGD on t (no momentum)."""
    rank = rank_by_mass(torch.logsumexp(scores / EPS, dim=0))
    for _ in range(L):
        t.requires_grad_(True)
        w = cluster_prior(t, K)[rank]
        q = sinkhorn(scores, w, EPS, T)
        value = -(q * scores).sum(1).mean() + GAMMA * kl_from_uniform(w) / K
        (grad,) = torch.autograd.grad(value, t)
        t = (t - LR * grad.clamp(-1, 1)).detach()
    return q.detach()


def pot_step(scores: np.ndarray, t: float) -> np.ndarray:
    n = scores.shape[0]
    a = np.full(n, 1.0 / n, dtype=scores.dtype)
    rank = rank_by_mass(torch.logsumexp(torch.from_numpy(scores) / EPS, dim=0)).numpy()

    def objective(t_value: float) -> tuple[float, np.ndarray]:
        w = cluster_prior(torch.tensor(t_value), K).numpy()[rank].astype(scores.dtype)
        plan = n * ot.sinkhorn(a, w, -scores, EPS, numItermax=T, stopThr=0)
        kl = -np.log(K) - np.log(w).mean()
        return float(-(plan * scores).sum(1).mean() + GAMMA * kl / K), plan

    h = 1e-3
    for _ in range(L):
        value, plan = objective(t)
        grad = (objective(t + h)[0] - value) / h
        t -= LR * float(np.clip(grad, -1, 1))
    return plan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7, help="interleaved rounds (each times every contender once; medians reported)")
    parser.add_argument("--pause", type=float, default=0.3,
                        help="seconds of sleep before each timed call, so that the previous contender's spinning "
                             "BLAS/OpenMP threads have parked (0 = back to back)")
    args = parser.parse_args()
    warnings.simplefilter("ignore", UserWarning)  # POT: "Sinkhorn did not converge" (T = 3 by design)

    g = torch.Generator().manual_seed(0)
    scores = torch.rand(N, K, generator=g) * 2 - 1
    labeler = AdaptiveSelfLabeler(K, eps=EPS, n_iters=T, outer_steps=L, gamma=GAMMA)
    reverse = AdaptiveSelfLabeler(K, eps=EPS, n_iters=T, outer_steps=L, gamma=GAMMA)
    reverse.forward_mode = False
    relaxed = AdaptiveSelfLabeler(K, eps=EPS, n_iters=T, outer_steps=L, gamma=GAMMA, reg_m=RELAXED_REG_M)
    uniform = AdaptiveSelfLabeler(K, prior="uniform", eps=EPS, n_iters=T, reg_m=RELAXED_REG_M)
    floored = AdaptiveSelfLabeler(K, prior="uniform", eps=EPS, n_iters=T, reg_m=RELAXED_REG_M,
                                  size_bounds=(0.5 / K, 1.0))

    times = interleaved_seconds(
        {
            "ours (rescaled kernel, matvecs)": lambda: labeler(scores, last=128),
            "ours, autograd dF/dt": lambda: reverse(scores, last=128),
            f"ours, relaxed sizes reg_m {RELAXED_REG_M}": lambda: relaxed(scores, last=128),
            "ours, uniform prior, relaxed": lambda: uniform(scores, last=128),
            "ours, uniform, relaxed + floor": lambda: floored(scores, last=128),
            "plain log-domain + autograd": lambda: plain_step(scores, torch.tensor(0.0)),
            "POT ot.sinkhorn + finite diff.": lambda: pot_step(scores.numpy(), 0.0),
        },
        args.repeats,
        args.pause,
    )
    ours = times["ours (rescaled kernel, matvecs)"]
    print(f"adaptive pseudo-labeling step: N={N} Ku={K} L={L} T={T} eps={EPS} float32, torch threads={torch.get_num_threads()}, {args.repeats} interleaved rounds, {args.pause} s pause before each call")
    print(f"{'contender':<34}{'median ms':>12}{'ours is x faster (median of per-round ratios)':>48}")
    for name, seconds in times.items():
        ratio = statistics.median(s / o for s, o in zip(seconds, ours))
        print(f"{name:<34}{statistics.median(seconds) * 1e3:>12.1f}{ratio:>48.1f}")
    floor = statistics.median(f / u for f, u in zip(times["ours, uniform, relaxed + floor"],
                                                     times["ours, uniform prior, relaxed"]))
    print(f"the size floor's cost: relaxed + floor over relaxed (uniform prior), median of per-round ratios: {floor:.2f}")

if __name__ == "__main__":
    main()
