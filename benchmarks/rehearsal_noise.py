"""How much a known-class rehearsal can resolve, and where its noise comes from (issue 14, item 3).

Reads the cached ``--select-setting`` rehearsals of ``benchmarks/quality.py`` (one file per replicate: the same
validation draws trained again with other seeds) and prints, per dataset, for one challenger against the
rehearsal's default and for each score (``val``: the held-out images of the pseudo-novel classes; ``pool``: the
pseudo-novel rows each run clustered, :data:`ncdlr.service.rehearsal.POOL_SPLIT`):

- **paired gap** challenger − default over the draws, in points, with its standard error over the draws and the
  rehearsal's choice (:func:`ncdlr.service.rehearsal.choose_candidate`: the default stays unless the gap clears
  two SEs), for the first replicate alone and for the mean over all replicates;
- **noise shares** (:func:`noise_parts`, two or more replicates): the spread of the gap between training seeds
  on one draw (``seed sd``) and between draws once the seeds are averaged out (``draw sd``, method of moments,
  floored at 0). Replicates shrink the first part only; the second is the draws' own disagreement, which only
  more draws average;
- **draws needed** (:func:`draws_needed`): how many draws would let the measured mean gap clear two SEs, with 1, 3
  and 10 replicates, if the noise parts hold;
- **agreement** of the two scores: the correlation of their per-draw gaps (first replicate).

Usage::

    .venv/bin/python benchmarks/rehearsal_noise.py --datasets fashion-cached fashion-cached-p1 \\
        --what uniform-sizes --draws 8 --replicates 3 --results /work/cache/quality-fm [--challenger uniform-relaxed]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NamedTuple

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

import quality  # noqa: E402  (the rehearsal caches and their reader)

from ncdlr.service.rehearsal import choose_candidate  # noqa: E402


class Gap(NamedTuple):
    """A paired rehearsal gap challenger − default, in points: ``mean``, its ``se`` over ``draws``, and ``chosen``
    (whether the rehearsal's rule picks the challenger)."""

    mean: float
    se: float
    draws: int
    chosen: bool


def paired_gap(default: np.ndarray, challenger: np.ndarray) -> Gap:
    """``default``, ``challenger``: ``[D]`` scores in [0, 1] of the same draws; the gap in points."""
    diff = 100.0 * (np.asarray(challenger, float) - np.asarray(default, float))
    se = float(diff.std(ddof=1) / np.sqrt(len(diff))) if len(diff) > 1 else float("nan")
    chosen = choose_candidate({"default": list(default), "challenger": list(challenger)}, "default") == "challenger"
    return Gap(float(diff.mean()), se, len(diff), chosen)


def noise_parts(default: np.ndarray, challenger: np.ndarray) -> tuple[float, float]:
    """``(seed sd, draw sd)`` of the paired gap, in points, from ``[R, D]`` scores (R ≥ 2 replicates of D draws).

    ``seed sd``: the pooled within-draw standard deviation over the replicates. ``draw sd``: the standard deviation
    between draws of the true (seed-averaged) gap, ``sqrt(max(0, var(draw means) − seed var / R))``. The SE of a
    rehearsal of D draws and R replicates is then ``sqrt((draw var + seed var / R) / D)``."""
    diff = 100.0 * (np.asarray(challenger, float) - np.asarray(default, float))
    if diff.ndim != 2 or diff.shape[0] < 2:
        raise ValueError(f"need [R ≥ 2, D] scores, got shape {diff.shape}")
    replicates = diff.shape[0]
    seed_var = float(diff.var(axis=0, ddof=1).mean())
    draw_var = float(diff.mean(axis=0).var(ddof=1)) - seed_var / replicates if diff.shape[1] > 1 else float("nan")
    return float(np.sqrt(seed_var)), float(np.sqrt(max(0.0, draw_var)))


def draws_needed(gap: float, seed_sd: float, draw_sd: float, replicates: int, margin_se: float = 2.0) -> float:
    """Draws a rehearsal of ``replicates`` replicates needs for ``gap`` (points) to clear ``margin_se`` SEs, from the
    noise parts (:func:`noise_parts`): ``D ≥ margin² (draw var + seed var / R) / gap²`` (inf for a zero gap)."""
    if gap == 0:
        return float("inf")
    return margin_se ** 2 * (draw_sd ** 2 + seed_sd ** 2 / replicates) / gap ** 2


def report(selection: dict, default: str, challenger: str) -> list[str]:
    """Lines for one dataset from :func:`quality.setting_selection`'s answer (its ``per_replicate`` scores)."""
    per_replicate = selection["per_replicate"]
    replicates = sorted(per_replicate)
    lines = []
    for score in quality.SELECT_SCORES:
        if not all(score in per_replicate[r] for r in replicates):
            lines.append(f"  {score:<4}  (not recorded in every replicate)")
            continue
        scores = {c: np.array([per_replicate[r][score][c] for r in replicates]) for c in (default, challenger)}
        first = paired_gap(scores[default][0], scores[challenger][0])
        text = f"  {score:<4}  replicate {replicates[0]}: {fmt(first)}"
        if len(replicates) > 1:
            mean = paired_gap(scores[default].mean(0), scores[challenger].mean(0))
            seed_sd, draw_sd = noise_parts(scores[default], scores[challenger])
            text += (f" | mean of {len(replicates)}: {fmt(mean)} | seed sd {seed_sd:.1f}, draw sd {draw_sd:.1f}"
                     f" | per draw {' '.join(f'{v:+.1f}' for v in 100 * (scores[challenger] - scores[default]).mean(0))}"
                     f" | draws to resolve {abs(mean.mean):.1f} at 2 SE with 1 / 3 / 10 replicates: "
                     + " / ".join(f"{draws_needed(mean.mean, seed_sd, draw_sd, r):.0f}" for r in (1, 3, 10)))
        lines.append(text)
    if all(s in per_replicate[replicates[0]] for s in quality.SELECT_SCORES):
        gaps = [np.subtract(per_replicate[replicates[0]][s][challenger], per_replicate[replicates[0]][s][default])
                for s in quality.SELECT_SCORES]
        corr = np.corrcoef(*gaps)[0, 1] if min(np.std(g) for g in gaps) > 0 else float("nan")
        lines.append(f"  val and pool gaps per draw, replicate {replicates[0]}: correlation {corr:+.2f}")
    return lines


def fmt(gap: Gap) -> str:
    return f"{gap.mean:+.1f} (SE {gap.se:.1f}, {gap.draws} draws){' → chosen' if gap.chosen else ''}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", nargs="+", required=True, choices=list(quality.CACHED) + ["synthetic"])
    parser.add_argument("--what", default="uniform-sizes",
                        choices=sorted({*quality.SETTING_REHEARSALS, *quality.EDIT_REHEARSALS}),
                        help="the --select-setting rehearsal to read (default uniform-sizes)")
    parser.add_argument("--draws", type=int, default=8, help="read the first N draws of each replicate (default 8)")
    parser.add_argument("--replicates", type=int, default=1, help="replicates 0..N-1 (default 1)")
    parser.add_argument("--challenger", default=None,
                        help="the candidate compared with the default (default: the last candidate)")
    parser.add_argument("--problem", choices=quality.SELECT_PROBLEMS, default="known",
                        help="read the rehearsals of this validation problem (quality.py --select-problem; planted: "
                             "the pool score is the planted classes' F1)")
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument("--results", type=Path, default=Path("/work/cache/quality"))
    args = parser.parse_args(argv)
    _, candidates, default = quality.rehearsal_candidates(args.what)
    challenger = args.challenger or list(candidates)[-1]
    names = {str(c): c for c in candidates}
    if str(challenger) not in names or names[str(challenger)] == default:
        parser.error(f"--challenger must be a candidate other than the default {default!r}: one of {list(names)}")
    challenger = names[str(challenger)]
    print(f"{args.what} ({args.problem} problem): {challenger} − {default}, pseudo-novel class-mean accuracy "
          f"(points){'; pool: planted F1 × 100' if args.problem == 'planted' else ''}")
    for dataset in args.datasets:
        selection = quality.setting_selection(args.results, dataset, None, args.epochs, args.what, args.draws,
                                              range(args.replicates), problem=args.problem)
        print(f"[{dataset}] ({selection['seconds']:.0f} s of training)")
        print("\n".join(report(selection, default, challenger)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
