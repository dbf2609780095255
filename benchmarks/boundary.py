"""Can a shift of the novel columns' scores place the known/novel boundary better, without labels?

Session 28's ``seed_spread.py --routing`` found that ncdlr sends more novel test images into known columns than UNO
does (OpenClipart-LT p2: 5.2 % against 3.0 %), and proposed a label-free shift ``b`` of the novel scores. This script
measures whether such a shift can pay. It trains cells as ``benchmarks/quality.py`` does (same configs, same
seeds), keeps the model's cosines ``s [N, K]`` of the test split and of the training rows (view 0), and scores the
test split with ``s[:, Ks:] + b`` (the prediction is the argmax over all K, as always):

- **headline**: ``b = 0``, novel / known class-mean accuracy (%), one Hungarian matching over all K classes;
- **midpoint rule** (label-free, :func:`midpoint_offset`): ``b`` that puts the boundary halfway between the known
  and the novel training rows — each known class's median margin ``max_known − max_novel`` and each novel
  cluster's (argmax over the novel columns) median margin ``max_novel − max_known``, averaged over classes and
  clusters alike, are made equal;
- **sweep**: every ``b`` of ``--offsets`` (uses the test labels: what the best possible shift could give, never a
  choice);
- **routing oracle**: every novel test image predicted among the novel columns only, the known test images as
  the model predicts them (uses the test labels: what a perfect known/novel boundary would give the novel side);
- **price of half**: the share of known test images (%) whose margin lies above the median margin of the novel
  test images the model sends to known columns — what a shift that fetched half of those images back would send
  the other way (uses the test labels).

If the sweep stays far below the routing oracle, the novel images that go to known columns sit deep on the known
side of the boundary, and no shift fetches them without sending many known images the other way.

Usage::

    .venv/bin/python benchmarks/boundary.py --datasets openclipart-cached-p2 --variants ncdlr-uniform-relax \\
        --seeds 10 11 [--holdout-view] [--offsets -0.1 0.4 11] [--table openclipart-cached-p2=PATH] \\
        [--save DIR | --from-saved DIR]

Seeds here are training seeds, given one by one; pick seeds the registered test cells do not use (they use
0–9), so that nothing about the test seeds is looked at twice.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

import quality  # noqa: E402  (the datasets' configs and tables)
from ncdlr.metrics import cluster_accuracy  # noqa: E402


def margins(scores: np.ndarray, num_known: int) -> np.ndarray:
    """``[N]`` how far each row sits on the novel side: ``max_{k ≥ Ks} s_k − max_{k < Ks} s_k`` of ``scores [N, K]``
    (cosines); positive = predicted novel."""
    return scores[:, num_known:].max(1) - scores[:, :num_known].max(1)


def midpoint_offset(known_scores: np.ndarray, known_labels: np.ndarray, novel_scores: np.ndarray,
                    num_known: int) -> float:
    """The label-free shift ``b`` of the novel scores that makes the known and the novel training rows' typical
    margins equal: ``(m_known − m_novel) / 2``, where ``m_known`` is the mean over known classes of each class's
    median of ``−margin`` (rows ``known_scores [Nk, K]`` with ``known_labels [Nk]``) and ``m_novel`` the mean over
    novel clusters (argmax over the novel columns of ``novel_scores [Nu, K]``) of each cluster's median margin.
    Adding ``b`` to every novel score moves every margin by ``b``, so afterwards both means are ``(m_known + m_novel)
    / 2``. Classes and clusters count alike, as the class-mean accuracy counts them."""
    m_known, m_novel = class_median_margins(known_scores, known_labels, novel_scores, num_known)
    return (m_known - m_novel) / 2


def class_median_margins(known_scores: np.ndarray, known_labels: np.ndarray, novel_scores: np.ndarray,
                         num_known: int) -> tuple[float, float]:
    """``(m_known, m_novel)`` of :func:`midpoint_offset`: how far, in cosine units, the known training rows sit on the
    known side (mean over classes of the class's median ``−margin``) and the novel ones on the novel side (mean over
    clusters of the cluster's median margin)."""
    known_margin = -margins(known_scores, num_known)
    novel_margin = margins(novel_scores, num_known)
    clusters = novel_scores[:, num_known:].argmax(1)
    m_known = np.mean([np.median(known_margin[known_labels == c]) for c in np.unique(known_labels)])
    m_novel = np.mean([np.median(novel_margin[clusters == j]) for j in np.unique(clusters)])
    return float(m_known), float(m_novel)


def shifted_accuracy(scores: np.ndarray, y_true: np.ndarray, num_known: int, train_counts, offset: float
                     ) -> tuple[float, float]:
    """Novel and known class-mean accuracy (%) of ``argmax(scores [N, K] with b = offset added to the novel
    columns)`` against ``y_true [N]``, under one Hungarian matching over all K classes."""
    shifted = scores.copy()
    shifted[:, num_known:] += offset
    r = cluster_accuracy(y_true, shifted.argmax(1), num_known, train_counts=train_counts)
    return 100 * r["novel"], 100 * r["known"]


def routing_oracle(scores: np.ndarray, y_true: np.ndarray, num_known: int, train_counts) -> tuple[float, float]:
    """Novel and known class-mean accuracy (%) when every novel test image (``y_true ≥ Ks``) is predicted among the
    novel columns only and every known one over all K, one matching over all K (uses the test labels)."""
    pred = scores.argmax(1)
    novel = y_true >= num_known
    pred[novel] = num_known + scores[novel, num_known:].argmax(1)
    r = cluster_accuracy(y_true, pred, num_known, train_counts=train_counts)
    return 100 * r["novel"], 100 * r["known"]


def cell_scores(dataset: str, variant: str, seed: int, table: str, holdout_view: bool) -> dict[str, np.ndarray]:
    """Train the cell ``(dataset, variant, seed)`` as ``quality.run_cell`` does and return the model's cosines
    ``[N, K]`` and labels ``[N]`` of the ``test``, ``known`` and ``novel`` splits (training rows: view 0), with
    ``num_known`` and the ``train_counts [K]``."""
    import torch

    from ncdlr.data.features import read_feature_table
    from ncdlr.service.local import embed, train

    splits = read_feature_table(table)
    if holdout_view:
        splits, _ = quality.hold_out_last_view(splits)
    cfg = quality.variant_config(dataset, variant, seed, splits, None)
    run = train(cfg, splits)
    run.model.eval()
    out: dict[str, np.ndarray] = {"num_known": np.asarray(splits.num_known),
                                  "train_counts": np.asarray(splits.train_counts())}
    with torch.no_grad():
        for split in ("test", "known", "novel"):
            out[split] = run.method.predict_logits(run.model, embed(run.model, splits.features[split])).numpy()
            out[f"y_{split}"] = splits.labels[split].numpy()
    return out


def readings(cell: dict[str, np.ndarray], offsets: np.ndarray) -> dict[str, object]:
    """Every reading of one cell (see the module docstring): ``headline``, ``midpoint_b`` and ``midpoint``
    (accuracies), ``sweep`` ``[(b, novel, known)]``, ``oracle``, ``novel_to_known`` (% of novel test images in known
    columns), ``price_of_half``, and the median margins ``known_margin`` / ``novel_margin`` (training rows,
    :func:`class_median_margins`) and ``lost_margin`` (the novel test images in known columns; NaN if none)."""
    ks, counts = int(cell["num_known"]), cell["train_counts"]
    test, y = cell["test"], cell["y_test"]
    b = midpoint_offset(cell["known"], cell["y_known"], cell["novel"], ks)
    known_margin, novel_margin = class_median_margins(cell["known"], cell["y_known"], cell["novel"], ks)
    novel_margins = margins(test[y >= ks], ks)  # [N_novel test]
    lost = novel_margins[novel_margins < 0]
    return {"headline": shifted_accuracy(test, y, ks, counts, 0.0), "midpoint_b": b,
            "known_margin": known_margin, "novel_margin": novel_margin,
            "lost_margin": float(np.median(lost)) if len(lost) else float("nan"),
            "midpoint": shifted_accuracy(test, y, ks, counts, b),
            "sweep": [(float(o), *shifted_accuracy(test, y, ks, counts, float(o))) for o in offsets],
            "oracle": routing_oracle(test, y, ks, counts),
            "novel_to_known": float(100 * len(lost) / len(novel_margins)),
            "price_of_half": price_of_half(test, y, ks)}


def price_of_half(scores: np.ndarray, y_true: np.ndarray, num_known: int) -> float:
    """% of the known test images (``y_true < Ks``) whose margin exceeds the median margin of the novel test images
    that ``scores [N, K]`` sends into known columns (margin < 0); 0 when there are none."""
    m = margins(scores, num_known)
    novel = y_true >= num_known
    lost = m[novel & (m < 0)]
    if not len(lost):
        return 0.0
    return float(100 * (m[~novel] > np.median(lost)).mean())


def summary_rows(dataset: str, variant: str, found: list[dict]) -> list[str]:
    """Markdown rows of ``found`` (one :func:`readings` per seed), means over the seeds."""
    def mean(key, i):
        return np.mean([r[key][i] for r in found])

    sweep = np.array([r["sweep"] for r in found]).mean(0)  # [offsets, 3]
    best = int(sweep[:, 1].argmax())
    return [f"| {dataset} | {variant} | {len(found)} | {mean('headline', 0):.1f} / {mean('headline', 1):.1f} "
            f"| {np.mean([r['novel_to_known'] for r in found]):.1f} % "
            f"| {np.mean([r['price_of_half'] for r in found]):.1f} % "
            f"| {np.mean([r['midpoint_b'] for r in found]):+.3f}: "
            f"{mean('midpoint', 0):.1f} / {mean('midpoint', 1):.1f} "
            f"| {sweep[best, 0]:+.2f}: {sweep[best, 1]:.1f} / {sweep[best, 2]:.1f} "
            f"| {mean('oracle', 0):.1f} / {mean('oracle', 1):.1f} |"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", nargs="+", default=["openclipart-cached-p2"], choices=sorted(quality.CACHED),
                        metavar="DATASET", help=f"cached datasets ({', '.join(sorted(quality.CACHED))})")
    parser.add_argument("--variants", nargs="+", default=["ncdlr-uniform-relax"], choices=sorted(quality.VARIANTS),
                        metavar="VARIANT", help="quality.py variants (its --help lists them)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[10, 11], help="training seeds, one by one")
    parser.add_argument("--offsets", nargs=3, type=float, default=[-0.1, 0.4, 11], metavar=("FROM", "TO", "N"),
                        help="the sweep's shifts b of the novel cosines: N values from FROM to TO")
    parser.add_argument("--holdout-view", action="store_true", help="train without each training row's last view, "
                        "as quality.py --holdout-view (OpenClipart-LT's registered cells)")
    parser.add_argument("--save", type=Path, help="also write each cell's cosines and labels to "
                        "SAVE/<dataset>-<variant>-s<seed>[-hv].npz (numpy), for readings without training again")
    parser.add_argument("--from-saved", type=Path, help="read each cell from SAVE's npz files (as --save wrote them) "
                        "instead of training it")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: two runs side by side on 2 cores, "
                        "as quality.py --workers 2 runs its cells)")
    quality.add_table_argument(parser)
    args = parser.parse_args(argv)
    tables = quality.parsed_tables(parser, args)
    import torch

    torch.set_num_threads(args.threads)
    offsets = np.linspace(args.offsets[0], args.offsets[1], int(args.offsets[2]))
    rows, sweeps = [], []
    for dataset in args.datasets:
        for variant in args.variants:
            found = []
            for seed in args.seeds:
                name = f"{dataset}-{variant}-s{seed}{'-hv' if args.holdout_view else ''}.npz"
                if args.from_saved:
                    if not (args.from_saved / name).is_file():
                        parser.error(f"--from-saved: no {name} in {args.from_saved} (write it with --save first)")
                    with np.load(args.from_saved / name) as saved:
                        cell = dict(saved)
                else:
                    cell = cell_scores(dataset, variant, seed, tables[dataset], args.holdout_view)
                if args.save:
                    args.save.mkdir(parents=True, exist_ok=True)
                    np.savez(args.save / name, **cell)
                r = readings(cell, offsets)
                found.append(r)
                print(f"{dataset} {variant} seed {seed}: headline novel {r['headline'][0]:.1f}, midpoint b "
                      f"{r['midpoint_b']:+.3f} → {r['midpoint'][0]:.1f}, oracle {r['oracle'][0]:.1f}; median margin of "
                      f"the training rows known {r['known_margin']:.3f}, novel {r['novel_margin']:.3f}; of the novel "
                      f"test images lost to known columns {r['lost_margin']:.3f}", flush=True)
            rows += summary_rows(dataset, variant, found)
            sweep = np.array([r["sweep"] for r in found]).mean(0)
            sweeps.append(f"| {dataset} | {variant} | "
                          + " | ".join(f"{n:.1f} / {k:.1f}" for _, n, k in sweep) + " |")
    print("\n| dataset | method | seeds | headline novel / known | novel test images → known | price of half "
          "| midpoint rule (label-free) b: novel / known | best shift of the sweep b: novel / known "
          "| routing oracle novel / known |")
    print("|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print("\nThe sweep, novel / known (%) at each shift b of the novel cosines, means over the seeds:\n")
    print("| dataset | method | " + " | ".join(f"{o:+.2f}" for o in offsets) + " |")
    print("|---|---|" + "---|" * len(offsets))
    print("\n".join(sweeps))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
