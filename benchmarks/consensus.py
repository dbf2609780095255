"""Consensus of several seeds' runs against the seed spread (issue 14, item 3), read from cells that exist.

A run either separates two small novel classes or merges them, and which one depends on the training seed
(docs/results.md, sessions 20 and 24). Clustering's standard remedy for an outcome that depends on the start is to
train from several starts and combine them. This script measures two label-free combinations of ``M`` runs of one
(dataset, variant), each run a cell of ``benchmarks/quality.py`` that kept its predictions:

- **pick**: keep the one run whose clustering of the novel training rows agrees best with the others' (the medoid:
  highest mean adjusted Rand index, :func:`medoid`) — one model, as cheap at prediction as a single run;
- **vote**: align every run's novel clusters to the medoid's (:func:`align_clusters`: the Hungarian matching of
  their cluster ids on the novel training rows, no labels read) and take the majority of the ``M`` aligned test
  predictions per image, ties to the medoid (:func:`vote`) — ``M`` models at prediction.

Over every subset of ``M`` of the ``S`` seeds that have cells it prints, in points of test novel class-mean accuracy
under the test split's Hungarian matching (the headline's measure):

- single runs (mean ± std over the seeds), the pick and the vote (mean ± std over the subsets);
- **agreement**: the share of novel training rows two seeds' runs put in the same cluster once renamed
  (:func:`aligned_agreement`), mean over the pairs of seeds — how alike the partitions are that a vote combines;
- **vote − members**: the vote against the mean of its own ``M`` runs, averaged over the subsets, with a
  jackknife standard error over the seeds (:func:`jackknife_se`: each seed left out in turn, the subsets without
  it), since the subsets share seeds;
- with ``--gap A B``: the vote of A − the vote of B on the same seed subsets (the fair comparison of two methods
  that are both given ``M`` trainings), jackknife SE likewise.

Usage::

    .venv/bin/python benchmarks/consensus.py --datasets openclipart-cached --variants ncdlr uno --seeds 10 \\
        --size 5 --results /work/cache/quality-hv --holdout-view [--gap ncdlr uno]
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path
from typing import NamedTuple

import numpy as np
from scipy.optimize import linear_sum_assignment
from sklearn.metrics import adjusted_rand_score

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

import quality  # noqa: E402  (the cell paths and the datasets' tables)

from ncdlr.data.features import read_class_summary, read_feature_table  # noqa: E402
from ncdlr.metrics import cluster_accuracy  # noqa: E402


def align_clusters(reference: np.ndarray, other: np.ndarray, num_clusters: int) -> np.ndarray:
    """``[Ku]``: for each cluster id of ``other``, the id of ``reference`` it is matched to — the Hungarian matching
    that maximises the rows both put together (``reference``, ``other``: ``[N]`` cluster ids ``0..Ku-1`` of the same
    N rows). A permutation of ``0..Ku-1``, so that a cluster no training row fell in is renamed too (which
    :func:`ncdlr.metrics.hungarian_mapping`, a dict over the ids present, would leave out); label-free."""
    overlap = np.zeros((num_clusters, num_clusters), dtype=np.int64)
    np.add.at(overlap, (np.asarray(other, np.int64), np.asarray(reference, np.int64)), 1)
    rows, cols = linear_sum_assignment(overlap, maximize=True)
    mapping = np.empty(num_clusters, dtype=np.int64)
    mapping[rows] = cols
    return mapping


def aligned_agreement(reference: np.ndarray, other: np.ndarray, num_clusters: int) -> float:
    """The share of the N rows that ``other [N]`` puts in the cluster of ``reference [N]`` it is renamed to
    (:func:`align_clusters`); 1 for the same partition under any naming."""
    rename = align_clusters(reference, other, num_clusters)
    return float(np.mean(rename[np.asarray(other, np.int64)] == np.asarray(reference, np.int64)))


def agreement_matrix(clusterings: np.ndarray) -> np.ndarray:
    """``[M, M]``: the adjusted Rand index between every two rows of ``clusterings [M, N]``, 0 on the diagonal."""
    m = len(clusterings)
    agreement = np.zeros((m, m))
    for i, j in itertools.combinations(range(m), 2):
        agreement[i, j] = agreement[j, i] = adjusted_rand_score(clusterings[i], clusterings[j])
    return agreement


def medoid(clusterings: np.ndarray | None = None, agreement: np.ndarray | None = None) -> int:
    """The index of the clustering (a row of ``clusterings [M, N]``, ``M ≥ 2``) with the highest mean adjusted Rand
    index to the others; the first of equals. ``agreement [M, M]`` (:func:`agreement_matrix`), when given, is used
    instead of ``clusterings``."""
    agreement = agreement_matrix(clusterings) if agreement is None else agreement
    return int(np.argmax(agreement.sum(1)))


def vote(test_preds: np.ndarray, novel_train: np.ndarray, num_known: int, num_novel: int,
         reference: int | None = None) -> np.ndarray:
    """``[N]`` the consensus prediction over all ``K = Ks + Ku`` columns of ``M`` runs: ``test_preds [M, N]`` their
    predictions (known columns ``0..Ks-1``, novel ``Ks..K-1``), ``novel_train [M, N']`` their novel cluster ids
    (``0..Ku-1``) of the same novel training rows. Each run's novel columns are renamed to the medoid's
    (:func:`medoid`, :func:`align_clusters`), known columns kept; each image takes the most frequent column, a tie
    going to the medoid's own prediction. ``reference``: the medoid's index, when the caller has it already."""
    test_preds, novel_train = np.asarray(test_preds, np.int64), np.asarray(novel_train, np.int64)
    ref = medoid(novel_train) if reference is None else reference
    aligned = test_preds.copy()
    for j in range(len(test_preds)):
        rename = np.concatenate([np.arange(num_known), num_known + align_clusters(novel_train[ref], novel_train[j],
                                                                                   num_novel)])
        aligned[j] = rename[test_preds[j]]
    votes = np.stack([(aligned == k).sum(0) for k in range(num_known + num_novel)])  # [K, N]
    own = aligned[ref]
    tie = votes[own, np.arange(len(own))] == votes.max(0)
    return np.where(tie, own, votes.argmax(0))


def novel_accuracy(y_true: np.ndarray, pred: np.ndarray, num_known: int) -> float:
    """Test novel class-mean accuracy (%) of ``pred [N]`` under the one Hungarian matching over all classes (the
    headline's :func:`ncdlr.metrics.cluster_accuracy`)."""
    return 100.0 * cluster_accuracy(y_true, pred, num_known)["novel"]


def jackknife_se(values: np.ndarray, subsets: list[tuple[int, ...]], seeds: list[int]) -> float:
    """The jackknife standard error over ``seeds`` of the mean of ``values [B]``, one per seed subset of
    ``subsets``: each seed left out, the mean over the subsets without it. ``nan`` when a seed is in every subset."""
    values = np.asarray(values, float)
    left_out = []
    for s in seeds:
        keep = np.array([s not in sub for sub in subsets])
        if not keep.any():
            return float("nan")
        left_out.append(values[keep].mean())
    left_out = np.asarray(left_out)
    n = len(seeds)
    return float(np.sqrt((n - 1) / n * ((left_out - left_out.mean()) ** 2).sum()))


class Consensus(NamedTuple):
    """One (dataset, variant) over its seed subsets of one size, in points: ``single`` per-seed accuracies
    ``{seed: acc}``, ``agreement`` (share of rows, :func:`aligned_agreement`, mean over pairs of seeds), and per subset
    (``subsets``, seed tuples) the ``pick`` (medoid run), the ``vote`` and the ``members`` (mean of its runs)."""

    single: dict[int, float]
    agreement: float
    subsets: list[tuple[int, ...]]
    pick: np.ndarray
    vote: np.ndarray
    members: np.ndarray


def consensus(y_true: np.ndarray, num_known: int, num_novel: int, cells: dict[int, dict], size: int) -> Consensus:
    """:class:`Consensus` of ``cells`` (``{seed: cell}``, each with ``test_pred [N]`` and ``novel_train_pred [N']``)
    over every subset of ``size`` seeds."""
    if size < 2 or len(cells) < size:
        raise ValueError(f"need 2 <= size <= seeds, got size {size} of {len(cells)} seeds")
    seeds = sorted(cells)
    single = {s: novel_accuracy(y_true, np.asarray(cells[s]["test_pred"]), num_known) for s in seeds}
    subsets = list(itertools.combinations(seeds, size))
    train = {s: np.asarray(cells[s]["novel_train_pred"], np.int64) for s in seeds}
    ari = agreement_matrix(np.stack([train[s] for s in seeds]))  # once: every subset's medoid reads its block
    index = {s: i for i, s in enumerate(seeds)}
    agreement = float(np.mean([aligned_agreement(train[a], train[b], num_novel)
                               for a, b in itertools.combinations(seeds, 2)]))
    pick, voted, members = [], [], []
    for sub in subsets:
        rows = [index[s] for s in sub]
        ref = medoid(agreement=ari[np.ix_(rows, rows)])
        pick.append(single[sub[ref]])
        clusterings = np.stack([train[s] for s in sub])
        preds = np.stack([cells[s]["test_pred"] for s in sub])
        voted.append(novel_accuracy(y_true, vote(preds, clusterings, num_known, num_novel, ref), num_known))
        members.append(np.mean([single[s] for s in sub]))
    return Consensus(single, agreement, subsets, np.array(pick), np.array(voted), np.array(members))


def row(dataset: str, variant: str, c: Consensus, size: int) -> str:
    """One markdown row of the table :func:`main` prints."""
    single = np.array(list(c.single.values()))
    gain = c.vote - c.members
    seeds = sorted(c.single)
    return (f"| {dataset} | {variant} | {len(seeds)} | {c.agreement:.2f} | {size} ({len(c.subsets)}) "
            f"| {single.mean():.1f} ± {single.std():.1f} | {c.pick.mean():.1f} ± {c.pick.std():.1f} "
            f"| {c.vote.mean():.1f} ± {c.vote.std():.1f} "
            f"| {gain.mean():+.1f} ({jackknife_se(gain, c.subsets, seeds):.1f}) |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", nargs="+", default=["openclipart-cached"], choices=sorted(quality.CACHED))
    parser.add_argument("--variants", nargs="+", default=["ncdlr", "uno"])
    parser.add_argument("--seeds", type=int, default=10, help="read the cells of seeds 0..N-1 (those that exist)")
    parser.add_argument("--size", type=int, default=5, help="M, the runs combined (every subset of M seeds)")
    parser.add_argument("--gap", nargs=2, metavar=("A", "B"), help="also print vote(A) − vote(B) on the same seed "
                        "subsets, with its jackknife SE")
    quality.add_cell_arguments(parser)
    args = parser.parse_args(argv)
    tables = quality.parsed_tables(parser, args)
    print("| dataset | method | seeds | two seeds agree (aligned) | M (subsets) | single run | pick (medoid) | vote "
          "| vote − members (SE) |")
    print("|---|---|---|---|---|---|---|---|---|")
    gaps = []
    for dataset in args.datasets:
        num_known, num_novel, _, _ = read_class_summary(tables[dataset])
        y_true = read_feature_table(tables[dataset], splits=("test",)).labels["test"].numpy()
        found = {}
        for variant in dict.fromkeys(args.variants + (args.gap or [])):
            cells = quality.read_cells(args.results, dataset, variant, args.seeds, holdout_view=args.holdout_view)
            cells = {s: c for s, c in cells.items() if "test_pred" in c and "novel_train_pred" in c}
            if len(cells) <= args.size:
                print(f"| {dataset} | {variant} | {len(cells)} | | {args.size} | (needs more than M seeds with "
                      "test_pred and novel_train_pred) | | | |")
                continue
            found[variant] = consensus(y_true, num_known, num_novel, cells, args.size)
            if variant in args.variants:
                print(row(dataset, variant, found[variant], args.size))
        if args.gap and all(v in found for v in args.gap):
            a, b = (found[v] for v in args.gap)
            b_vote = dict(zip(b.subsets, b.vote))
            common = [sub for sub in a.subsets if sub in b_vote]
            diff = np.array([v - b_vote[sub] for sub, v in zip(a.subsets, a.vote) if sub in b_vote])
            seeds = sorted(set(itertools.chain.from_iterable(common)))
            gaps.append(f"| {dataset} | {diff.mean():+.1f} ({jackknife_se(diff, common, seeds):.1f}) | "
                        f"{np.mean([a.single[s] - b.single[s] for s in seeds]):+.1f} | {len(common)} |")
    if gaps:
        print(f"\n| dataset | vote({args.gap[0]}) − vote({args.gap[1]}) (SE) | single runs, paired mean | subsets |")
        print("|---|---|---|---|")
        print("\n".join(gaps))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
