"""Where the seed spread of novel accuracy comes from (issue 14, item 3), image by image.

Reads the cells of ``benchmarks/quality.py`` that kept their test predictions (``test_pred``) and the transductive
clustering of the novel training rows (``novel_train``), and the test labels of the dataset's table. For each
(dataset, variant), over the seeds:

- **test novel**: the headline, class-mean accuracy over the novel classes of the test split, mean ± std (ddof 0);
- **train novel**: the same measure on the novel *training* rows (task-aware, view 0; about twice the images per
  class), mean ± std — a second reading of how far the seeds' clusterings differ;
- **variance shares**: how much of the test novel variance each group of novel classes (head / medium / tail by
  training count, 3:4:3) carries — ``share_g = (K_g / Ku) · cov(acc_g, novel) / var(novel)``, summing to 1;
- **resolution**: the binomial standard error of a class-mean accuracy measured on ``n_c`` test images per class,
  ``sqrt(Σ_c p_c (1 − p_c) / n_c) / Ku`` with ``p_c`` the class's accuracy averaged over the seeds — what the
  test split can resolve, whatever the model;
- **test novel, carried matching** (cells that kept ``novel_train_pred``): the test novel accuracy when each novel
  cluster is named by the Hungarian matching fitted on the novel *training* rows and the known columns keep their
  own class (:func:`carried_correct`) — the matching is not fitted on the images it scores, as when a user names
  the clusters once and then predicts; with a small test split the per-split matching can pick, for each few-image
  class, whichever cluster happens to hold its images;
- **images**: over pairs of seeds, the mean number of novel test images scored right by one seed and wrong by
  the other (each seed under its own Hungarian matching), and of those in the tail classes;
- **merged** (cells that kept ``test_novel_pred``): how many novel classes share their cluster with another novel
  class — each class's cluster is where most of its test images go among the novel columns (task-aware,
  :func:`merged_classes`), mean over the seeds. Three classes in one cluster count 3; a class split over two
  clusters counts 0. With Ku clusters, every merge leaves a cluster to split some other class.

With ``--known`` it also prints, per (dataset, variant), where the **known** test images go
(:func:`known_detail`): the known class-mean accuracy, the share of known test images predicted into a novel
column, and each known class's accuracy and novel share, ordered by training count.

With ``--sizes`` it also prints, per (dataset, variant), the sizes of the model's novel clusters on the novel
training rows (:func:`cluster_sizes`, label-free: the argmax over the novel columns that ``novel_train_pred`` kept):
how many of the Ku clusters hold no row, and the largest over the smallest non-empty cluster, against the same
ratio of the true novel classes' training counts; and in how many runs ``labeler.relax_bound`` held the sizes, from
which epoch (:func:`relax_stops`).

With ``--routing`` it also prints, per (dataset, variant), how much of the test novel accuracy is lost between the
known and the novel columns rather than among the novel clusters (:func:`routing`): the novel test images'
class-mean accuracy when only the novel columns compete (task-aware, ``test_novel_pred``, its own Hungarian
matching, as the training pool's ``train novel`` is scored) against the headline (all K columns), the share of
novel test images predicted into a known column, and of known test images into a novel one, and the share of each
novel class's test images sent into known columns averaged over the novel classes, overall and by head / medium /
tail.

With ``--gap A B`` (two variants) it also prints the **paired gap** A − B of test novel accuracy over the seeds both
have, with two standard errors (:func:`paired_gap`): the seeds' (the spread of the per-seed differences) and the test
split's (a bootstrap of the test images within each novel class, the seeds' correctness held fixed) — the second
is how far the same two models could score apart on another test split of the same size, which more seeds do not
shrink. With several datasets it ends on their **pooled** gap (:func:`pooled_gap`: the mean, SE ``sqrt(Σ SE²) / n``);
``--results-of DATASET=DIR`` and ``--holdout-view-of DATASET`` read a dataset's cells from elsewhere, so partitions
cached apart (OpenClipart-LT's holdout-view cells, Fashion's plain ones) pool in one command. A variant ``NAME@E``
reads the cells of ``quality.py --epochs E`` (e.g. ``--gap uno@20 uno``: UNO trained 20 epochs against its default).

Usage::

    .venv/bin/python benchmarks/seed_spread.py --datasets openclipart-cached-p1 --variants ncdlr uno --seeds 5 \\
        --results /work/cache/quality-rec [--gap ncdlr uno] [--holdout-view] [--known] [--routing]
    .venv/bin/python benchmarks/seed_spread.py --datasets openclipart-cached fashion-cached --variants ncdlr --seeds 10 \\
        --results /work/cache/quality-fm --results-of openclipart-cached=/work/cache/quality-hv \\
        --holdout-view-of openclipart-cached --gap ncdlr uno
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

import quality  # noqa: E402  (the cell paths and the datasets' tables)
from ncdlr.data.features import read_class_summary, read_feature_table  # noqa: E402
from ncdlr.metrics import correct_under_matching, head_medium_tail, hungarian_mapping  # noqa: E402


def per_class_accuracy(correct: np.ndarray, y_true: np.ndarray, classes: list[int]) -> np.ndarray:
    """``[S, C]``: the share of each class's test images that ``correct [S, N]`` (bool or 0/1, one row per seed)
    marks right, for the classes ``classes`` (C of them) of ``y_true [N]``."""
    return np.stack([correct[:, y_true == c].mean(1) for c in classes], axis=1)


def resolution(per_class: np.ndarray, y_true: np.ndarray, classes: list[int]) -> float:
    """What the test split can resolve of a class-mean accuracy, in points: the binomial standard error
    ``100 · sqrt(Σ_c p_c (1 − p_c) / n_c) / C``, with ``p_c`` class ``c``'s accuracy averaged over the seeds
    (``per_class [S, C]`` in %, as :func:`per_class_accuracy` × 100) and ``n_c`` its test images in ``y_true [N]``
    — how far one model's score would move on another test split of the same size, whatever the model."""
    p = np.asarray(per_class).mean(0) / 100
    counts = np.array([(np.asarray(y_true) == c).sum() for c in classes])
    return float(100 * np.sqrt((p * (1 - p) / counts).sum()) / len(classes))


def carried_correct(y_true: np.ndarray, test_pred, num_known: int, train_novel_labels: np.ndarray,
                    train_novel_pred) -> np.ndarray:
    """``[N]`` bool: test predictions ``test_pred [N]`` (over all K columns) scored with the cluster names fitted on
    the novel training rows: novel column ``Ks + j`` → the true class the Hungarian matching of
    ``train_novel_pred [M]`` (novel clusters ``0..Ku-1``) to ``train_novel_labels [M]`` (class ids ``≥ Ks``) gives
    it; known column ``k`` → known class ``k``; an unmatched novel column is wrong."""
    mapping = hungarian_mapping(np.asarray(train_novel_labels), np.asarray(train_novel_pred) + num_known)
    named = np.array([p if p < num_known else mapping.get(int(p), -1) for p in np.asarray(test_pred)], dtype=np.int64)
    return named == np.asarray(y_true)


def merged_classes(y_true: np.ndarray, novel_pred, novel_classes: list[int]) -> int:
    """How many of ``novel_classes`` share their majority cluster with another of them: for each class, the most
    frequent of the task-aware predictions ``novel_pred [N]`` (novel columns ``0..Ku-1``) over its test images of
    ``y_true [N]``; a class with no test image is left out."""
    pred = np.asarray(novel_pred)
    majority = [int(np.bincount(pred[y_true == c]).argmax()) for c in novel_classes if (y_true == c).any()]
    counts = np.bincount(majority) if majority else np.zeros(0, dtype=np.int64)
    return int(sum(counts[m] > 1 for m in majority))


def spread(y_true: np.ndarray, train_counts: list[int], num_known: int, cells: list[dict],
           train_novel_labels: np.ndarray | None = None) -> dict[str, float]:
    """The measures of the module docstring for one (dataset, variant) over ``cells`` (one per seed, each with
    ``test_pred [N]`` and ``novel_train``); accuracies in %, ``y_true [N]`` the test labels."""
    novel_classes = [int(c) for c in np.unique(y_true) if c >= num_known]
    groups = head_medium_tail(novel_classes, train_counts)
    correct = np.stack([correct_under_matching(y_true, c["test_pred"]) for c in cells])  # [S, N]
    per_class = per_class_accuracy(correct, y_true, novel_classes) * 100  # [S, Ku]
    novel = per_class.mean(1)
    index = {c: i for i, c in enumerate(novel_classes)}
    out = {"seeds": len(cells), "test_novel": novel.mean(), "test_novel_std": novel.std(),
           "train_novel": np.mean([c["novel_train"]["all"] * 100 for c in cells]),
           "train_novel_std": np.std([c["novel_train"]["all"] * 100 for c in cells])}
    for name, members in groups.items():
        if not members:  # fewer than four novel classes leave the medium group empty
            out[f"share_{name}"] = 0.0
            continue
        acc = per_class[:, [index[c] for c in members]].mean(1)
        cov = np.mean((acc - acc.mean()) * (novel - novel.mean()))
        out[f"share_{name}"] = len(members) / len(novel_classes) * cov / novel.var() if novel.var() > 0 else float("nan")
    out["resolution"] = resolution(per_class, y_true, novel_classes)
    tail = np.isin(y_true, groups["tail"])
    novel_rows = y_true >= num_known
    pairs = list(itertools.combinations(range(len(cells)), 2))
    out["images_differing"] = np.mean([(correct[a] != correct[b])[novel_rows].sum() for a, b in pairs])
    out["tail_images_differing"] = np.mean([(correct[a] != correct[b])[tail].sum() for a, b in pairs])
    out["novel_test_images"], out["tail_test_images"] = int(novel_rows.sum()), int(tail.sum())
    if all(c.get("test_novel_pred") is not None for c in cells):
        out["merged"] = float(np.mean([merged_classes(y_true, c["test_novel_pred"], novel_classes) for c in cells]))
    if train_novel_labels is not None and all("novel_train_pred" in c for c in cells):
        carried = np.stack([carried_correct(y_true, c["test_pred"], num_known, train_novel_labels,
                                            c["novel_train_pred"]) for c in cells])  # [S, N]
        novel = per_class_accuracy(carried, y_true, novel_classes).mean(1) * 100  # [S]
        out["test_novel_carried"], out["test_novel_carried_std"] = novel.mean(), novel.std()
    return out


def known_detail(y_true: np.ndarray, num_known: int, train_counts: list[int], cells: list[dict]) -> dict:
    """Where the known test images go, for one (dataset, variant) over ``cells`` (one per seed, ``test_pred [N]`` over
    all K columns; ``y_true [N]``): ``known`` the known class-mean accuracy under the test split's Hungarian
    matching (the headline's), ``to_novel`` the share of known test images predicted into a novel column
    (``≥ Ks``), and ``classes`` one ``(class, train count, accuracy, novel share)`` per known class, most training
    images first; means over the seeds, in %."""
    known_classes = sorted((c for c in range(num_known) if (y_true == c).any()), key=lambda c: -train_counts[c])
    correct = np.stack([correct_under_matching(y_true, c["test_pred"]) for c in cells])  # [S, N]
    to_novel = np.stack([np.asarray(c["test_pred"]) >= num_known for c in cells])  # [S, N]
    acc = per_class_accuracy(correct, y_true, known_classes).mean(0) * 100  # [Ks]
    share = per_class_accuracy(to_novel, y_true, known_classes).mean(0) * 100  # [Ks]
    known_rows = y_true < num_known
    return {"seeds": len(cells), "known": float(acc.mean()), "to_novel": float(to_novel[:, known_rows].mean() * 100),
            "classes": [(c, int(train_counts[c]), float(a), float(n)) for c, a, n in zip(known_classes, acc, share)]}


def novel_to_known(y_true: np.ndarray, num_known: int, test_pred) -> float:
    """The share (%) of the novel test images (``y_true [N]`` ≥ ``num_known``) that ``test_pred [N]`` (over all K
    columns) puts into a known column."""
    return float((np.asarray(test_pred)[y_true >= num_known] < num_known).mean() * 100)


def routing(y_true: np.ndarray, num_known: int, cells: list[dict], train_counts=None) -> dict[str, float]:
    """Where the novel test images are lost, over ``cells`` (one per seed, each with ``test_pred [N]`` over all K
    columns and ``test_novel_pred [N]`` over the novel columns ``0..Ku-1``; ``y_true [N]``), means and stds (ddof 1)
    over the seeds, in %: ``novel`` the headline (all K columns, the test split's one matching), ``novel_only`` the
    novel images' class-mean accuracy with only the novel columns competing (their own Hungarian matching),
    ``novel_to_known`` the share of novel test images predicted into a known column, ``known_to_novel`` the share
    of known test images predicted into a novel one. ``novel_only − novel`` is what the known/novel boundary costs.
    ``novel_to_known_class``: the share of each novel class's test images predicted into a known column, averaged
    over the novel classes (as the class-mean accuracy counts them); with ``train_counts [K]`` also over the novel
    head / medium / tail classes (``novel_to_known_head`` ...; 3:4:3 by training count; a group with no class is
    left out)."""
    novel_rows, known_rows = y_true >= num_known, y_true < num_known
    novel_classes = [int(c) for c in np.unique(y_true[novel_rows])]
    groups = {} if train_counts is None else head_medium_tail(range(len(novel_classes)),
                                                              [train_counts[c] for c in novel_classes])
    groups = {group: members for group, members in groups.items() if members}  # [indices into novel_classes]
    readings: dict[str, list[float]] = {"novel": [], "novel_only": [], "novel_to_known": [], "known_to_novel": [],
                                        "novel_to_known_class": [], **{f"novel_to_known_{g}": [] for g in groups}}
    for cell in cells:
        test_pred, novel_pred = np.asarray(cell["test_pred"]), np.asarray(cell["test_novel_pred"])
        correct = correct_under_matching(y_true, test_pred)[None]
        readings["novel"].append(per_class_accuracy(correct, y_true, novel_classes).mean() * 100)
        only = correct_under_matching(y_true[novel_rows], novel_pred[novel_rows] + num_known)[None]
        readings["novel_only"].append(per_class_accuracy(only, y_true[novel_rows], novel_classes).mean() * 100)
        readings["novel_to_known"].append(novel_to_known(y_true, num_known, test_pred))
        readings["known_to_novel"].append((test_pred[known_rows] >= num_known).mean() * 100)
        lost = per_class_accuracy((test_pred < num_known)[None], y_true, novel_classes)[0] * 100  # [Ku]
        readings["novel_to_known_class"].append(lost.mean())
        for group, members in groups.items():
            readings[f"novel_to_known_{group}"].append(lost[members].mean())
    out: dict[str, float] = {"seeds": len(cells)}
    for name, values in readings.items():
        out[name] = float(np.mean(values))
        out[f"{name}_std"] = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
    return out


def head_detail(cells: list[dict]) -> dict | None:
    """How well the label-free head choice of ``model.heads`` > 1 did, over ``cells`` (one per seed) that kept
    ``quality.head_diagnosis``'s ``heads`` (``selected``, ``loss_u [H]``, ``test [H] {novel, known, all}``):
    test novel class-mean accuracy (%) of the ``selected`` head, of the ``mean`` head, of the ``best`` and ``worst``
    head (picked with the test labels: what a perfect or a useless choice would give), each mean ± std over the
    seeds; ``picked_best`` the share of seeds whose choice was the best head; ``rank_corr`` the mean over seeds of
    the Spearman correlation between the heads' novel loss and their novel accuracy (negative: a lower loss goes
    with a better head). None when no cell has head diagnostics."""
    found = [c["heads"] for c in cells if c.get("heads")]
    if not found:
        return None
    novel = np.array([[t["novel"] * 100 for t in h["test"]] for h in found])  # [S, H]
    chosen = novel[np.arange(len(found)), [h["selected"] for h in found]]  # [S]
    corr = []
    for h, row in zip(found, novel):
        loss = np.asarray(h["loss_u"], dtype=float)
        if np.ptp(loss) > 0 and np.ptp(row) > 0:
            corr.append(np.corrcoef(np.argsort(np.argsort(loss)), np.argsort(np.argsort(row)))[0, 1])
    out = {"seeds": len(found), "heads": novel.shape[1], "picked_best": float((chosen == novel.max(1)).mean()),
           "rank_corr": float(np.mean(corr)) if corr else float("nan")}
    for name, values in (("selected", chosen), ("mean", novel.mean(1)), ("best", novel.max(1)),
                         ("worst", novel.min(1))):
        out[name], out[f"{name}_std"] = float(values.mean()), float(values.std())
    return out


def cluster_sizes(cells: list[dict], num_novel: int) -> dict[str, float] | None:
    """Over the seeds' ``novel_train_pred [N_novel]`` (novel cluster ids ``0..Ku-1``; no labels read): the number of
    clusters holding no row (mean, min, max) and the size ratio largest / smallest non-empty cluster (median, min,
    max). None when a cell did not keep ``novel_train_pred``."""
    if not cells or any("novel_train_pred" not in c for c in cells):
        return None
    counts = [np.bincount(np.asarray(c["novel_train_pred"], dtype=np.int64), minlength=num_novel) for c in cells]
    empty = np.array([(k == 0).sum() for k in counts], dtype=np.float64)
    ratio = np.array([k.max() / k[k > 0].min() for k in counts])
    kl = np.array([kl_from_uniform(k) for k in counts])
    return {"seeds": len(cells), "empty": empty.mean(), "empty_min": empty.min(), "empty_max": empty.max(),
            "ratio": float(np.median(ratio)), "ratio_min": ratio.min(), "ratio_max": ratio.max(), "kl": kl.mean(),
            "kl_std": kl.std()}


def relax_stops(cells: list[dict]) -> str:
    """How many of the seeds' runs ``labeler.relax_bound`` stopped, and from which epochs their sizes were held
    (``sizes_held_from_epoch`` of each cell, label-free), e.g. ``"2 of 5 (from epochs 3, 7)"``; ``"—"`` when no cell
    ran with a bound (cells before session 49 have no ``relax_bound``)."""
    bounded = [c for c in cells if c.get("relax_bound", "none") != "none"]
    if not bounded:
        return "—"
    stops = sorted(int(c["sizes_held_from_epoch"]) for c in bounded if c.get("sizes_held_from_epoch") is not None)
    where = f" (from epochs {', '.join(map(str, stops))})" if stops else ""
    return f"{len(stops)} of {len(bounded)}{where}"


def clusters_held_by_largest(train_labels: np.ndarray, novel_pred, num_novel: int) -> int:
    """How many of the ``num_novel`` clusters of ``novel_pred [M]`` (novel cluster ids ``0..Ku-1`` of the novel
    training rows) have the largest novel class of ``train_labels [M]`` as their most frequent class: 1 when that
    class has a cluster of its own, more when near-equal sizes spread it over several (each a spare piece that one
    Hungarian matching on a small test split can hand to a few-image class). Reads the training labels."""
    labels, pred = np.asarray(train_labels), np.asarray(novel_pred)
    largest = np.bincount(labels).argmax()
    return int(sum(np.bincount(labels[pred == k]).argmax() == largest for k in range(num_novel) if (pred == k).any()))


def kl_from_uniform(sizes: np.ndarray) -> float:
    """``KL(p ‖ uniform)`` (nats) of the shares ``p`` of ``sizes [K]``: 0 for equal sizes, ``log K`` for one cluster."""
    p = np.asarray(sizes, dtype=np.float64) / np.sum(sizes)
    p = p[p > 0]
    return float(np.sum(p * np.log(p * len(sizes))))


def profile_on(counts, k: int) -> np.ndarray:
    """The sorted size profile of ``counts`` (classes with no row left out) carried to ``k`` clusters: log-sizes
    interpolated along the rank from the largest to the smallest, so the ends keep the classes' largest / smallest
    ratio. Shares ``[k]``, largest first: what ``k`` clusters as imbalanced, in the same shape, would hold."""
    c = np.sort(np.asarray([x for x in counts if x > 0], dtype=np.float64))[::-1]
    p = np.exp(np.interp(np.linspace(0, 1, k), np.linspace(0, 1, len(c)), np.log(c)))
    return p / p.sum()


def paired_gap(y_true: np.ndarray, num_known: int, cells_a: list[dict], cells_b: list[dict], draws: int = 2000,
               seed: int = 0, correct=None, classes: list[int] | None = None) -> dict[str, float]:
    """Test novel accuracy of A minus B (class-mean, %), over seeds paired by position (``cells_a[i]`` and
    ``cells_b[i]`` share seed i; each has ``test_pred [N]``), and its two standard errors. ``correct(cell) -> [N]``
    bool scores a cell's test images (default: under the test split's own matching, :func:`correct_under_matching`;
    or :func:`carried_correct`'s names). ``classes``: the class-mean over these novel class ids only (a head /
    medium / tail group; default every novel class of ``y_true``); the matching is still the one over all classes.

    - ``seed_se``: ``std(d_s, ddof=1) / sqrt(S)`` of the per-seed gaps ``d_s`` (what more seeds shrink);
    - ``sample_se``: the std over ``draws`` bootstrap test splits — each novel class's test images drawn again with
      replacement, as many as it has, the seed-mean gap recomputed on them; each seed's Hungarian matching is held
      at the one found on the real split (what a larger test split would shrink);
    - ``total_se``: both together, ``sqrt(seed_se² + sample_se²)``.
    """
    if len(cells_a) != len(cells_b) or len(cells_a) < 2:
        raise ValueError(f"need the same number (≥ 2) of seeds for both, got {len(cells_a)} and {len(cells_b)}")
    novel_classes = [int(c) for c in np.unique(y_true) if c >= num_known] if classes is None else list(classes)
    correct = correct or (lambda cell: correct_under_matching(y_true, cell["test_pred"]))
    diff = np.stack([correct(a).astype(float) - correct(b).astype(float) for a, b in zip(cells_a, cells_b)])  # [S, N]
    per_seed = per_class_accuracy(diff, y_true, novel_classes).mean(1) * 100  # [S]
    members = [np.flatnonzero(y_true == c) for c in novel_classes]
    rng = np.random.default_rng(seed)
    mean_diff = diff.mean(0)  # [N]: the seed-mean gap per image
    boot = np.zeros(draws)
    for m in members:
        boot += mean_diff[rng.choice(m, size=(draws, len(m)))].mean(1)
    boot *= 100 / len(members)
    seed_se = per_seed.std(ddof=1) / np.sqrt(len(per_seed))
    sample_se = boot.std()
    return {"gap": per_seed.mean(), "seed_se": seed_se, "sample_se": sample_se,
            "total_se": float(np.hypot(seed_se, sample_se)), "seeds": len(per_seed)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", nargs="+", default=["openclipart-cached-p1"], choices=sorted(quality.CACHED))
    parser.add_argument("--variants", nargs="+", default=["ncdlr", "uno"])
    parser.add_argument("--seeds", type=int, default=5, help="seeds 0..N-1")
    parser.add_argument("--gap", nargs=2, metavar=("A", "B"), help="also print the paired gap A − B with the seeds' "
                        "and the test split's standard errors")
    parser.add_argument("--known", action="store_true", help="also print where the known test images go: each "
                        "known class's accuracy and share predicted into a novel column, by training count")
    parser.add_argument("--heads", action="store_true", help="also print, for cells of model.heads > 1, the test "
                        "novel accuracy of the head chosen by the novel loss against the heads' mean, best and worst")
    parser.add_argument("--routing", action="store_true", help="also print what the known/novel boundary costs the "
                        "novel test images: their accuracy with only the novel columns competing against the headline, "
                        "and the shares routed across the boundary (novel → known, known → novel)")
    parser.add_argument("--sizes", action="store_true", help="also print the sizes of the novel clusters on the "
                        "novel training rows (label-free): clusters holding no row, largest / smallest non-empty")
    parser.add_argument("--gap-groups", action="store_true", help="with --gap: also the paired gap over the novel "
                        "head / medium / tail classes (3:4:3 by training count), each with its two standard errors")
    parser.add_argument("--draws", type=int, default=2000, help="bootstrap draws of the test split (--gap)")
    parser.add_argument("--holdout-view-of", action="append", default=[], metavar="DATASET",
                        help="read this dataset's --holdout-view cells (repeatable; --holdout-view: every dataset's)")
    quality.add_cell_arguments(parser, results_of=True)
    args = parser.parse_args(argv)
    tables = quality.parsed_tables(parser, args)
    results_of = quality.parsed_results_of(parser, args)
    gaps = []  # paired_gap's record of each dataset under the test split's own matching, pooled at the end
    print("| dataset | method | seeds | test novel | train novel | variance share head / medium / tail "
          "| test resolution (binomial SE) | novel test images differing between two seeds (tail) "
          "| test novel, carried matching | novel classes sharing a cluster (of Ku) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for dataset in args.datasets:
        num_known, num_novel, _, train_counts = read_class_summary(tables[dataset])
        labels = read_feature_table(tables[dataset], splits=("test", "novel")).labels
        y_true, train_novel_labels = labels["test"].numpy(), labels["novel"].numpy()
        novel_groups = head_medium_tail([int(c) for c in np.unique(y_true) if c >= num_known], train_counts)
        kept = {}  # variant -> {seed: cell} of the cells that kept their test predictions
        for variant in dict.fromkeys(args.variants + (args.gap or [])):
            name, epochs = quality.variant_epochs(variant)
            found = quality.read_cells(results_of.get(dataset, args.results), dataset, name, args.seeds,
                                       holdout_view=args.holdout_view or dataset in args.holdout_view_of,
                                       epochs=epochs)
            kept[variant] = {s: c for s, c in found.items() if "test_pred" in c}
        for variant in args.variants:
            cells = list(kept[variant].values())
            if len(cells) < 2:
                print(f"| {dataset} | {variant} | {len(cells)} | (fewer than two cells with test_pred) | | | | | | |")
                continue
            r = spread(y_true, train_counts, num_known, cells, train_novel_labels)
            carried = (f"{r['test_novel_carried']:.1f} ± {r['test_novel_carried_std']:.1f}"
                       if "test_novel_carried" in r else "(cells without novel_train_pred)")
            merged = f"{r['merged']:.1f} of {num_novel}" if "merged" in r else "(cells without test_novel_pred)"
            print(f"| {dataset} | {variant} | {r['seeds']} | {r['test_novel']:.1f} ± {r['test_novel_std']:.1f} | "
                  f"{r['train_novel']:.1f} ± {r['train_novel_std']:.1f} | {r['share_head']:.2f} / "
                  f"{r['share_medium']:.2f} / {r['share_tail']:.2f} | {r['resolution']:.1f} | "
                  f"{r['images_differing']:.0f} of {r['novel_test_images']} ({r['tail_images_differing']:.1f} of "
                  f"{r['tail_test_images']}) | {carried} | {merged} |")
        if args.known:
            print(f"\n{dataset}, known test classes (most training images first): accuracy / % predicted novel\n")
            print("| method | seeds | known | known → novel | per class (train count: accuracy / novel) |")
            print("|---|---|---|---|---|")
            for variant in args.variants:
                cells = list(kept[variant].values())
                if not cells:
                    continue
                k = known_detail(y_true, num_known, train_counts, cells)
                classes = "; ".join(f"{n}: {a:.1f} / {v:.1f}" for _, n, a, v in k["classes"])
                print(f"| {variant} | {k['seeds']} | {k['known']:.1f} | {k['to_novel']:.1f} | {classes} |")
            print()
        if args.routing:
            print(f"\n{dataset}, the known/novel boundary: test novel class-mean (%) over all K columns (the headline) "
                  "and with only the novel columns competing; shares of test images routed across it\n")
            print("| method | seeds | novel (all K columns) | novel (novel columns only) | novel → known "
                  "| known → novel | novel → known, class-mean | … novel head / medium / tail |")
            print("|---|---|---|---|---|---|---|---|")
            for variant in args.variants:
                cells = [c for c in kept[variant].values() if c.get("test_novel_pred") is not None]
                if not cells:
                    continue
                r = routing(y_true, num_known, cells, train_counts)
                cols = [f"{r[name]:.1f} ± {r[name + '_std']:.1f}" for name in ("novel", "novel_only")]
                cols += [f"{r[name]:.1f} ± {r[name + '_std']:.1f} %" for name in ("novel_to_known", "known_to_novel",
                                                                                   "novel_to_known_class")]
                cols.append(" / ".join(f"{r[f'novel_to_known_{g}']:.1f}" if f"novel_to_known_{g}" in r else "–"
                                       for g in ("head", "medium", "tail")) + " %")
                print(f"| {variant} | {r['seeds']} | " + " | ".join(cols) + " |")
            print()
        if args.heads:
            print(f"\n{dataset}, several heads: test novel class-mean (%) of the head the novel loss chose, and of the "
                  "heads' mean, best and worst (read with the test labels)\n")
            print("| method | seeds | heads | chosen | mean head | best head | worst head | chose the best "
                  "| rank corr. loss vs novel |")
            print("|---|---|---|---|---|---|---|---|---|")
            for variant in args.variants:
                h = head_detail(list(kept[variant].values()))
                if h is None:
                    continue
                print(f"| {variant} | {h['seeds']} | {h['heads']} | " + " | ".join(
                    f"{h[k]:.1f} ± {h[k + '_std']:.1f}" for k in ("selected", "mean", "best", "worst"))
                    + f" | {100 * h['picked_best']:.0f} % | {h['rank_corr']:+.2f} |")
            print()
        if args.sizes:
            counts = np.asarray(train_counts[num_known:])
            print(f"\n{dataset}, novel clusters on the novel training rows (no labels read): clusters holding no row "
                  f"of {num_novel}, largest / smallest non-empty cluster (true classes: "
                  f"{counts.max() / counts.min():.0f}), KL of the sizes from uniform (true classes: "
                  f"{kl_from_uniform(counts):.2f}; the known classes' profile on {num_novel} clusters: "
                  f"{kl_from_uniform(profile_on(train_counts[:num_known], num_novel)):.2f})\n")
            print("| method | seeds | clusters holding no row: mean (min–max) | size ratio: median (min–max) "
                  "| KL from uniform (nats) | clusters the largest novel class holds the most rows of (labels read) "
                  "| runs labeler.relax_bound held |")
            print("|---|---|---|---|---|---|---|")
            for variant in args.variants:
                z = cluster_sizes(list(kept[variant].values()), num_novel)
                if z is not None:
                    held = [clusters_held_by_largest(train_novel_labels, c["novel_train_pred"], num_novel)
                            for c in kept[variant].values()]
                    print(f"| {variant} | {z['seeds']} | {z['empty']:.1f} ({z['empty_min']:.0f}–"
                          f"{z['empty_max']:.0f}) | {z['ratio']:.0f} ({z['ratio_min']:.0f}–{z['ratio_max']:.0f}) "
                          f"| {z['kl']:.2f} ± {z['kl_std']:.2f} | {np.mean(held):.1f} ({min(held)}–{max(held)}) "
                          f"| {relax_stops(list(kept[variant].values()))} |")
            print()
        if args.gap:
            first, second = (kept[v] for v in args.gap)
            pairs = [(first[s], second[s]) for s in sorted(set(first) & set(second))]
            if len(pairs) < 2:
                print(f"\n{dataset}: fewer than two seeds with test_pred for both of {' and '.join(args.gap)}")
                continue
            scorers = {"the test split's own matching": None}
            if all("novel_train_pred" in c for pair in pairs for c in pair):
                scorers["carried matching"] = lambda cell: carried_correct(y_true, cell["test_pred"], num_known,
                                                                           train_novel_labels, cell["novel_train_pred"])
            for name, correct in scorers.items():
                g = paired_gap(y_true, num_known, [pair[0] for pair in pairs], [pair[1] for pair in pairs],
                               draws=args.draws, correct=correct)
                print(f"\n{dataset}: {args.gap[0]} − {args.gap[1]} on the test novel classes ({name}), {g['seeds']} "
                      f"paired seeds: {g['gap']:+.1f} (SE over seeds {g['seed_se']:.1f}, over test images "
                      f"{g['sample_se']:.1f}, together {g['total_se']:.1f})")
                if correct is None:
                    gaps.append(g)
                if args.gap_groups:
                    for group, members in novel_groups.items():
                        if not members:
                            continue
                        h = paired_gap(y_true, num_known, [pair[0] for pair in pairs], [pair[1] for pair in pairs],
                                       draws=args.draws, correct=correct, classes=members)
                        print(f"  novel {group} ({len(members)} classes, {int(np.isin(y_true, members).sum())} test "
                              f"images): {h['gap']:+.1f} (SE over seeds {h['seed_se']:.1f}, over test images "
                              f"{h['sample_se']:.1f}, together {h['total_se']:.1f})")
            print()
    if args.gap and len(gaps) > 1:
        p = pooled_gap(gaps)
        print(f"pooled over {p['parts']} datasets: {args.gap[0]} − {args.gap[1]} {p['gap']:+.2f} (SE {p['se']:.2f}; the "
              "mean of the gaps under the test split's own matching, SE sqrt(Σ SE²) / n)")
    return 0


def pooled_gap(gaps: list[dict[str, float]]) -> dict[str, float]:
    """The mean of ``n`` independent gaps (each :func:`paired_gap`'s record) and its SE ``sqrt(Σ total_se²) / n``:
    partitions with their own data and seeds, weighted alike whatever their SE."""
    if not gaps:
        raise ValueError("need at least one gap to pool")
    n = len(gaps)
    return {"gap": float(np.mean([g["gap"] for g in gaps])),
            "se": float(np.sqrt(sum(g["total_se"] ** 2 for g in gaps)) / n), "parts": n}


if __name__ == "__main__":
    raise SystemExit(main())
