"""Where a method's novel clusters lose accuracy between the crops it trained on and unseen images (issue 14, item 3).

Reads the cells of ``benchmarks/quality.py --holdout-view`` (trained without each training row's last cached view;
``*-hv.json``). Every score is the class-mean accuracy over the novel classes (%), and every one names the novel
clusters the same way: by the Hungarian matching fitted on the novel training rows' seen view (view 0), as a user
names the clusters once and then predicts (``seed_spread.carried_correct``). Four readings, one step apart:

1. **seen crop** — the novel training rows, view 0, a crop the model trained on (task-aware: argmax over the
   novel columns) = quality.py's ``novel_train``;
2. **unseen crop** — the same images, their held-out last view: a random crop of the same augmentation that
   training never showed (task-aware);
3. **unseen image** — the test split's novel images, centre view (task-aware);
4. **unseen image, all classes** — the same, argmax over all K classes (task-agnostic; a novel image predicted as a
   known class is wrong): what seed_spread.py calls "carried matching".

So 1 → 2 is the fit to the very crops trained on, 2 → 3 the step to new images (and to the centre view), 3 → 4 the
novel images lost to known classes. Two more columns come from the cells' own scores: the **headline** (the test
split's novel class-mean accuracy under its own Hungarian matching, as docs/results.md's tables report it) and the
**known** classes' test accuracy. With ``--gap A B`` it also prints the paired difference A − B of each reading
over the seeds both have, and its standard error over those seeds.

A variant ``NAME@E`` reads the cells of ``quality.py --epochs E`` (e.g. ``--gap ncdlr@5 ncdlr``).

Usage::

    .venv/bin/python benchmarks/carry.py --datasets openclipart-cached openclipart-cached-p2 --variants ncdlr uno \\
        --results /work/cache/quality-hv [--gap ncdlr uno] [--groups]
    .venv/bin/python benchmarks/carry.py --variants ncdlr@5 ncdlr --gap ncdlr@5 ncdlr --results /work/cache/quality-hv
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

import quality  # noqa: E402  (the cell paths and the datasets' tables)
from ncdlr.data.features import read_class_summary, read_feature_table  # noqa: E402
from ncdlr.metrics import head_medium_tail  # noqa: E402
from seed_spread import carried_correct, per_class_accuracy  # noqa: E402

READINGS = ("seen crop", "unseen crop", "unseen image", "unseen image, all classes")
SCORES = ("headline", "known")  # from the cell's own results (the test split's matching), not carried names
GROUPS = ("head", "medium", "tail")


def class_mean(correct: np.ndarray, y_true: np.ndarray, classes=None) -> float:
    """Class-mean accuracy (%) of ``correct [N]`` (bool) over ``classes`` (default: those present in ``y_true [N]``)."""
    classes = [int(c) for c in np.unique(y_true)] if classes is None else classes
    return 100 * float(per_class_accuracy(correct[None], y_true, classes).mean())


def readings(cell: dict, num_known: int, train_labels: np.ndarray, test_labels: np.ndarray,
             groups: dict[str, list[int]] | None = None) -> dict[str, float]:
    """The four scores of the module docstring for one cell (``--holdout-view``; novel ``train_labels [M]`` and
    ``test_labels [N]`` in class ids ``0..K-1``), each with the names fitted on ``novel_train_pred`` [M]
    (``seed_spread.carried_correct``). With ``groups`` (``{"head": [class ids], ...}``) also each reading over each
    group's classes, as ``"<reading>/<group>"``."""
    def carried(y: np.ndarray, pred) -> np.ndarray:  # pred over all K columns
        return carried_correct(y, pred, num_known, train_labels, cell["novel_train_pred"])

    def aware(pred) -> np.ndarray:  # task-aware predictions (novel clusters 0..Ku-1) as columns Ks..K-1
        return np.asarray(pred) + num_known

    novel_test = test_labels >= num_known
    y_test = test_labels[novel_test]
    scored = {"seen crop": (carried(train_labels, aware(cell["novel_train_pred"])), train_labels),
              "unseen crop": (carried(train_labels, aware(cell["novel_heldout_pred"])), train_labels),
              "unseen image": (carried(y_test, aware(cell["test_novel_pred"])[novel_test]), y_test),
              "unseen image, all classes": (carried(y_test, np.asarray(cell["test_pred"])[novel_test]), y_test)}
    out = {name: class_mean(correct, y) for name, (correct, y) in scored.items()}
    out.update(headline=100 * cell["results"]["none"]["novel"], known=100 * cell["results"]["none"]["known"])
    for group, members in (groups or {}).items():
        out.update({f"{name}/{group}": class_mean(correct, y, members) for name, (correct, y) in scored.items()})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", nargs="+", default=["openclipart-cached"], choices=sorted(quality.CACHED))
    parser.add_argument("--variants", nargs="+", default=["ncdlr", "uno"])
    parser.add_argument("--seeds", type=int, default=5, help="seeds 0..N-1 (those with a cell are read)")
    parser.add_argument("--gap", nargs=2, metavar=("A", "B"), help="also print A − B of each reading, paired over the seeds both have, with its SE")
    parser.add_argument("--groups", action="store_true", help="also each reading over the head / medium / tail "
                        "novel classes (3:4:3 by training count); with --gap also their gaps (seen crop, unseen "
                        "crop, unseen image, as 'seen crop/tail' ...)")
    quality.add_cell_arguments(parser, holdout_view=False)
    args = parser.parse_args(argv)
    tables = quality.parsed_tables(parser, args)
    print("| dataset | method | seeds | " + " | ".join(READINGS) + " | seen → unseen crop | unseen crop → image | "
          + " | ".join(SCORES) + " |")
    print("|---|---|---|" + "---|" * (len(READINGS) + 2 + len(SCORES)))
    gaps = []
    for dataset in args.datasets:
        num_known, _, _, train_counts = read_class_summary(tables[dataset])
        labels = read_feature_table(tables[dataset], splits=("test", "novel")).labels
        train_labels, test_labels = labels["novel"].numpy(), labels["test"].numpy()
        groups = head_medium_tail(sorted({int(c) for c in train_labels}), train_counts)
        per_variant = {}
        for variant in dict.fromkeys(args.variants + (args.gap or [])):
            name, epochs = quality.variant_epochs(variant)
            cells = quality.read_cells(args.results, dataset, name, args.seeds, holdout_view=True, epochs=epochs)
            per_variant[variant] = {s: readings(c, num_known, train_labels, test_labels, groups)
                                    for s, c in cells.items()}
        for variant in args.variants:
            rows = per_variant[variant]
            if not rows:
                print(f"| {dataset} | {variant} | 0 | (no --holdout-view cells) |"
                      + " |" * (len(READINGS) + 1 + len(SCORES)))
                continue
            values = {r: np.array([row[r] for row in rows.values()]) for r in READINGS + SCORES}
            cols = [f"{values[r].mean():.1f} ± {values[r].std():.1f}" for r in READINGS]
            steps = [values["unseen crop"] - values["seen crop"], values["unseen image"] - values["unseen crop"]]
            print(f"| {dataset} | {variant} | {len(rows)} | " + " | ".join(cols) + " | "
                  + " | ".join(f"{s.mean():+.1f}" for s in steps) + " | "
                  + " | ".join(f"{values[r].mean():.1f} ± {values[r].std():.1f}" for r in SCORES) + " |")
            if args.groups:
                for group in GROUPS:
                    g = {r: np.array([row[f"{r}/{group}"] for row in rows.values()]) for r in READINGS}
                    print(f"| {dataset} | {variant}, {group} classes | {len(rows)} | "
                          + " | ".join(f"{v.mean():.1f}" for v in g.values()) + " | "
                          + f"{(g['unseen crop'] - g['seen crop']).mean():+.1f} | "
                          + f"{(g['unseen image'] - g['unseen crop']).mean():+.1f} |")
        if args.gap:
            a, b = (per_variant[v] for v in args.gap)
            seeds = sorted(set(a) & set(b))
            if len(seeds) >= 2:
                names = READINGS + SCORES + (tuple(f"{r}/{g}" for g in GROUPS for r in READINGS[:3])
                                             if args.groups else ())
                gaps.append((dataset, seeds, {r: np.array([a[s][r] - b[s][r] for s in seeds]) for r in names}))
    for dataset, seeds, diff in gaps:
        se = {r: d.std(ddof=1) / np.sqrt(len(d)) for r, d in diff.items()}
        print(f"\n{dataset}: {args.gap[0]} − {args.gap[1]} over seeds {seeds}: "
              + "; ".join(f"{r} {d.mean():+.1f} (SE {se[r]:.1f})" for r, d in diff.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
