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
  that are both given ``M`` trainings), jackknife SE likewise;
- with ``--restart-score``: a third label-free combination, one run's own score in place of the others' agreement
  (:func:`restart_pick`): each run is scored by how often the held-out crop of a novel training row (the cached view
  that ``quality.py --holdout-view`` kept out of training) falls in the same cluster as the row's view 0
  (:func:`heldout_agreement`), and the run scoring highest is kept. A run that splits one large class over two
  clusters draws an arbitrary boundary through it, which unseen crops of its images cross; merging two small classes
  draws none. A second table gives, per (dataset, variant), the rank correlation of that score with the test novel
  accuracy and with the novel training rows' clustering accuracy over the seeds, and the pick against the mean of its
  subset's runs (jackknife SE), novel and known.

Usage::

    .venv/bin/python benchmarks/consensus.py --datasets openclipart-cached --variants ncdlr uno --seeds 10 \\
        --size 5 --results /work/cache/quality-hv --holdout-view [--gap ncdlr uno] [--restart-score]
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path
from typing import NamedTuple

import numpy as np
from scipy.optimize import linear_sum_assignment
from scipy.stats import spearmanr
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


def heldout_agreement(cell: dict) -> float:
    """The share of novel training rows whose held-out crop (``novel_heldout_pred [N']``, a cached view training never
    showed) falls in the same novel cluster as their view 0 (``novel_train_pred [N']``); label-free, in ``[0, 1]``.
    ``nan`` for a cell without held-out predictions (one not run with ``quality.py --holdout-view``)."""
    heldout = cell.get("novel_heldout_pred")
    if heldout is None:
        return float("nan")
    return float(np.mean(np.asarray(heldout, np.int64) == np.asarray(cell["novel_train_pred"], np.int64)))


class RestartPick(NamedTuple):
    """One (dataset, variant) picked by :func:`heldout_agreement` over its seed subsets of one size: per seed the
    ``score``, the test ``novel`` and ``known`` accuracies and the ``train_novel`` clustering accuracy (points); per
    subset (``subsets``) the picked run's ``pick_novel`` and ``pick_known`` and the means of the subset's runs,
    ``members`` (novel) and ``members_known``."""

    score: dict[int, float]
    novel: dict[int, float]
    known: dict[int, float]
    train_novel: dict[int, float]
    subsets: list[tuple[int, ...]]
    pick_novel: np.ndarray
    pick_known: np.ndarray
    members: np.ndarray
    members_known: np.ndarray


def restart_pick(cells: dict[int, dict], size: int) -> RestartPick:
    """:class:`RestartPick` of ``cells`` (``{seed: cell}``: quality.py cells with ``results``, ``novel_train`` and
    held-out predictions) over every subset of ``size`` seeds: in each subset the run with the highest
    :func:`heldout_agreement` is kept (the first of equals, by seed). Accuracies are the cells' own headline numbers
    (the test split's Hungarian matching), so only the choice is new."""
    if size < 2 or len(cells) < size:
        raise ValueError(f"need 2 <= size <= seeds, got size {size} of {len(cells)} seeds")
    seeds = sorted(cells)
    score = {s: heldout_agreement(cells[s]) for s in seeds}
    if any(np.isnan(v) for v in score.values()):
        raise ValueError("every cell needs novel_heldout_pred: run quality.py with --holdout-view")
    novel = {s: 100.0 * cells[s]["results"]["none"]["novel"] for s in seeds}
    known = {s: 100.0 * cells[s]["results"]["none"]["known"] for s in seeds}
    train_novel = {s: 100.0 * cells[s]["novel_train"]["all"] for s in seeds}
    subsets = list(itertools.combinations(seeds, size))
    picked = [max(sub, key=lambda s: (score[s], -s)) for sub in subsets]
    return RestartPick(score, novel, known, train_novel, subsets, np.array([novel[s] for s in picked]),
                       np.array([known[s] for s in picked]),
                       np.array([np.mean([novel[s] for s in sub]) for sub in subsets]),
                       np.array([np.mean([known[s] for s in sub]) for sub in subsets]))


def rank_correlation(a: dict[int, float], b: dict[int, float]) -> float:
    """Spearman's rank correlation of two per-seed readings over their common seeds (``nan`` if either is constant)."""
    seeds = sorted(set(a) & set(b))
    values = [a[s] for s in seeds], [b[s] for s in seeds]
    if len(seeds) < 3 or min(len(set(v)) for v in values) < 2:
        return float("nan")
    return float(spearmanr(*values).statistic)


def restart_row(dataset: str, variant: str, r: RestartPick, size: int) -> str:
    """One markdown row of :func:`main`'s ``--restart-score`` table."""
    seeds = sorted(r.score)
    single = np.array([r.novel[s] for s in seeds])
    gain = r.pick_novel - r.members
    known_gain = r.pick_known - r.members_known
    scores = np.array([r.score[s] for s in seeds])
    return (f"| {dataset} | {variant} | {len(seeds)} | {scores.min():.3f}–{scores.max():.3f} "
            f"| {rank_correlation(r.score, r.novel):+.2f} | {rank_correlation(r.score, r.train_novel):+.2f} "
            f"| {size} ({len(r.subsets)}) | {single.mean():.1f} ± {single.std():.1f} "
            f"| {r.pick_novel.mean():.1f} ± {r.pick_novel.std():.1f} "
            f"| {gain.mean():+.1f} ({jackknife_se(gain, r.subsets, seeds):.1f}) "
            f"| {known_gain.mean():+.1f} ({jackknife_se(known_gain, r.subsets, seeds):.1f}) |")


def row(dataset: str, variant: str, c: Consensus, size: int) -> str:
    """One markdown row of the table :func:`main` prints."""
    single = np.array(list(c.single.values()))
    gain = c.vote - c.members
    seeds = sorted(c.single)
    return (f"| {dataset} | {variant} | {len(seeds)} | {c.agreement:.2f} | {size} ({len(c.subsets)}) "
            f"| {single.mean():.1f} ± {single.std():.1f} | {c.pick.mean():.1f} ± {c.pick.std():.1f} "
            f"| {c.vote.mean():.1f} ± {c.vote.std():.1f} "
            f"| {gain.mean():+.1f} ({jackknife_se(gain, c.subsets, seeds):.1f}) |")


def restart_gap_row(dataset: str, a: RestartPick, b: RestartPick) -> str:
    """One markdown row: ``a``'s pick − ``b``'s pick on the seed subsets both have (each method given the same
    trainings and its own label-free choice), novel and known with jackknife SEs, and the paired single-run gap."""
    b_at = {sub: i for i, sub in enumerate(b.subsets)}
    rows = [(i, b_at[sub]) for i, sub in enumerate(a.subsets) if sub in b_at]
    common = [a.subsets[i] for i, _ in rows]
    novel = np.array([a.pick_novel[i] - b.pick_novel[j] for i, j in rows])
    known = np.array([a.pick_known[i] - b.pick_known[j] for i, j in rows])
    seeds = sorted(set(itertools.chain.from_iterable(common)))
    return (f"| {dataset} | {novel.mean():+.1f} ({jackknife_se(novel, common, seeds):.1f}) "
            f"| {known.mean():+.1f} ({jackknife_se(known, common, seeds):.1f}) "
            f"| {np.mean([a.novel[s] - b.novel[s] for s in seeds]):+.1f} | {len(common)} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", nargs="+", default=["openclipart-cached"], choices=sorted(quality.CACHED))
    parser.add_argument("--variants", nargs="+", default=["ncdlr", "uno"])
    parser.add_argument("--seeds", type=int, default=10, help="read the cells of seeds 0..N-1 (those that exist)")
    parser.add_argument("--size", type=int, default=5, help="M, the runs combined (every subset of M seeds)")
    parser.add_argument("--gap", nargs=2, metavar=("A", "B"), help="also print vote(A) − vote(B) on the same seed "
                        "subsets, with its jackknife SE")
    parser.add_argument("--restart-score", action="store_true",
                        help="also pick each subset's run by its held-out-crop agreement (cells of --holdout-view) "
                        "and print that pick's table, with the score's rank correlations and the per-seed readings")
    quality.add_cell_arguments(parser)
    args = parser.parse_args(argv)
    tables = quality.parsed_tables(parser, args)
    print("| dataset | method | seeds | two seeds agree (aligned) | M (subsets) | single run | pick (medoid) | vote "
          "| vote − members (SE) |")
    print("|---|---|---|---|---|---|---|---|---|")
    gaps, restarts, per_seed, restart_gaps = [], [], [], []
    for dataset in args.datasets:
        num_known, num_novel, _, _ = read_class_summary(tables[dataset])
        y_true = read_feature_table(tables[dataset], splits=("test",)).labels["test"].numpy()
        found, picks = {}, {}
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
            if args.restart_score:
                r = picks[variant] = restart_pick(cells, args.size)
                if variant in args.variants:
                    restarts.append(restart_row(dataset, variant, r, args.size))
                    per_seed += [f"| {dataset} | {variant} | {s} | {r.score[s]:.3f} | {r.novel[s]:.1f} | "
                                 f"{r.train_novel[s]:.1f} | {r.known[s]:.1f} |" for s in sorted(r.score)]
        if args.gap and all(v in picks for v in args.gap):
            restart_gaps.append(restart_gap_row(dataset, *(picks[v] for v in args.gap)))
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
    if restarts:
        print("\n| dataset | method | seeds | held-out agreement (range) | rank corr. with test novel | with train novel "
              "| M (subsets) | single run | pick (held-out agreement) | pick − members, novel (SE) "
              "| pick − members, known (SE) |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        print("\n".join(restarts))
        print("\n| dataset | method | seed | held-out agreement | test novel | train novel | test known |")
        print("|---|---|---|---|---|---|---|")
        print("\n".join(per_seed))
    if restart_gaps:
        print(f"\n| dataset | pick({args.gap[0]}) − pick({args.gap[1]}), novel (SE) | known (SE) "
              "| single runs, paired mean novel | subsets |")
        print("|---|---|---|---|---|")
        print("\n".join(restart_gaps))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
