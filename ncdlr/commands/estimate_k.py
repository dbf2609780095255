"""Estimate the number of novel classes Ku (method.md §6; paper §3.5, Appendix "estimate k").

Clusters labeled (split "known") and unlabeled (split "novel") features together into Ks + k clusters
with Ward's agglomerative clustering, scores each k by the Hungarian accuracy on the labeled instances,
score = beta * instance_acc + (1 - beta) * class_mean_acc  (beta = 0.5; beta = 1 is the paper's baseline;
the class mean divides by Ks), and searches k in [0, k_max] with the paper's bisection.

Input: --features URI, a parquet feature table (file or folder; local path, file:// or s3://) with columns
embedding (list<float32>), label (int) and split (string: known | novel | val | test; only known and
novel rows are used). --data URI --encoder NAME [--pretrained URI] embeds the known and novel splits of a
prepared image dataset first (ncdlr.service.embed, Ray Data), as `ncdlr embed` does.

What is approximated (and what is not):
  * The Ward tree is built ONCE and cut at every candidate k (exact: the same as re-clustering per k).
  * Up to --ward-points rows (default 3000) the tree is exact Ward (scipy linkage).
  * Above that, rows are first grouped into --ward-points k-means micro-clusters (MiniBatchKMeans,
    seeded random init, 5 passes, assigned on a 128-d PCA projection of wider features) and Ward runs
    on their exact full-width centroids weighted by their sizes. This is Ward's merge order on all rows
    under one constraint: rows of one micro-cluster always share a cluster. Tail classes smaller than a
    micro-cluster (about rows / ward-points rows) can therefore be absorbed by a neighbour.
  * Above --max-samples rows (default 200000) a seeded uniform subsample is used.
  * The bisection evaluates O(log k_max) candidates and assumes a unimodal score curve; on a plateau
    it may stop anywhere on it (see docs/estimate_k.md).
Features are L2-normalised first (as the authors do); --no-normalize keeps them raw.

Example:
  ncdlr estimate-k --features runs/feats.parquet --k-max 100 --plot runs/k_curve.png --json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from ncdlr.data.storage import StorageError
from ncdlr.estimate_k import EstimateKConfig, EstimateKResult, KnownClusterScorer, estimate_num_novel

NAME = "estimate-k"
HELP = "estimate the number of novel classes Ku (Ward clustering + bisection on the known-class accuracy)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--features", metavar="URI", help="parquet feature table (embedding, label, split)")
    source.add_argument("--data", metavar="URI", help="prepared image dataset; embedded first with --encoder")
    parser.add_argument("--encoder", metavar="NAME", help="frozen encoder for --data (e.g. efficientnet_lite0)")
    parser.add_argument("--pretrained", metavar="URI", default="",
                        help="checkpoint of --encoder for --data (local path or s3://); see `ncdlr embed`")
    parser.add_argument("--k-max", type=int, default=None,
                        help="search k in [0, K_MAX]; default 2*Ks (at least 10). Set it above your guess.")
    parser.add_argument("--beta", type=float, default=0.5,
                        help="weight of the instance accuracy; 0.5 = the paper's mixed metric (recommended), "
                             "1.0 = its instance-accuracy baseline, which underestimates on long tails")
    parser.add_argument("--max-samples", type=int, default=200_000,
                        help="use at most this many rows (seeded uniform subsample); default 200000")
    parser.add_argument("--ward-points", type=int, default=3000,
                        help="exact Ward up to this many rows, else this many k-means micro-clusters "
                             "(memory ~ 8*N^2 bytes; default 3000 = 72 MB)")
    parser.add_argument("--no-normalize", action="store_true", help="do not L2-normalise the features")
    parser.add_argument("--seed", type=int, default=0, help="seeds the subsample and the micro-clusters")
    parser.add_argument("--plot", metavar="PATH", help="write the score curve over k as a PNG")
    parser.add_argument("--json", action="store_true",
                        help='print one JSON object as the last line: {"num_novel", "num_known", "score", "seconds", ...}')


def _training_rows(uri: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``features [N, D]``, ``labels [N]``, ``labeled [N]`` of the known + novel rows of a feature table
    (every check of :func:`ncdlr.data.features.read_feature_table`; val/test rows are not read)."""
    from ncdlr.data.features import read_feature_table

    return read_feature_table(uri, splits=("known", "novel")).labeled_rows()


def _features_from_dataset(args: argparse.Namespace) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Embed a prepared dataset with the frozen ``--encoder`` (``ncdlr.service.embed``), then read the table."""
    import tempfile

    from ncdlr.service.embed import embed_dataset

    if not args.encoder:
        raise ValueError("--data needs --encoder NAME (the frozen encoder to embed with)")
    with tempfile.TemporaryDirectory(prefix="ncdlr-estimate-k-") as tmp:
        table_uri = str(Path(tmp) / "features.parquet")
        stats = embed_dataset(args.data, table_uri, encoder=args.encoder, pretrained=args.pretrained or "",
                              splits=("known", "novel"))
        print(f"embedded {stats['rows']} images with {args.encoder} in {stats['seconds']:.1f} s "
              f"({stats['bad_images']} undecodable left out)")
        return _training_rows(table_uri)


def plot_score_curve(path: str | Path, scorer: KnownClusterScorer, result: EstimateKResult) -> None:
    """PNG of the mixed score, instance and class-mean accuracy over k, with the bisection's visits marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grid = np.unique(np.concatenate([np.linspace(0, result.k_max, min(result.k_max + 1, 121)).round().astype(int),
                                     np.fromiter(result.evaluations, dtype=int)]))
    acc = np.array([scorer.accuracies(int(k)) for k in grid])
    mixed = result.beta * acc[:, 0] + (1 - result.beta) * acc[:, 1]
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    ax.plot(grid, 100 * mixed, color="C0", lw=2, label=f"score (β = {result.beta:g})")
    ax.plot(grid, 100 * acc[:, 0], color="C1", lw=1, ls="--", label="instance accuracy (β = 1)")
    ax.plot(grid, 100 * acc[:, 1], color="C2", lw=1, ls=":", label="class-mean accuracy (β = 0)")
    visited = np.fromiter(result.evaluations, dtype=int)
    ax.scatter(visited, [100 * result.evaluations[k][0] for k in visited], color="C0", zorder=3,
               label="bisection evaluations")
    ax.axvline(result.num_novel, color="k", lw=1, label=f"estimate Ku = {result.num_novel}")
    ax.set_xlabel("number of novel classes k (clusters = Ks + k, Ks = %d)" % result.num_known)
    ax.set_ylabel("known-class clustering accuracy (%)")
    ax.set_title("Ku estimate: Ward clustering scored on the labeled instances")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    try:
        config = EstimateKConfig(k_max=args.k_max, beta=args.beta, ward_points=args.ward_points,
                                 max_samples=args.max_samples, l2_normalize=not args.no_normalize, seed=args.seed)
    except ValueError as exc:
        print(f"ncdlr estimate-k: {exc}", file=sys.stderr)
        return 2
    source = args.features or args.data
    try:
        if args.features:
            features, labels, labeled = _training_rows(args.features)
        else:
            features, labels, labeled = _features_from_dataset(args)
        result, scorer = estimate_num_novel(features, labels, labeled, config)
    except (ValueError, OSError, StorageError) as exc:
        print(f"ncdlr estimate-k: {exc}", file=sys.stderr)
        return 1
    mode = (f"Ward on {result.num_ward_leaves} k-means micro-clusters (approximate)" if result.approximate
            else "exact Ward")
    print(f"{source}: {result.num_rows} rows ({int(labeled.sum())} labeled), Ks = {result.num_known}, {mode}")
    for k, (score, inst, cls) in sorted(result.evaluations.items()):
        print(f"  k = {k:5d}  score {score:.4f}  (instance {inst:.4f}, class-mean {cls:.4f})")
    print(f"estimated number of novel classes Ku = {result.num_novel} (score {result.score:.4f}, "
          f"beta {result.beta:g}, k in [0, {result.k_max}]) in {result.seconds:.2f} s "
          f"(tree {result.tree_seconds:.2f} s)")
    if args.plot:
        plot_score_curve(args.plot, scorer, result)
        print(f"score curve: {args.plot}")
    if args.json:
        print(json.dumps({
            "num_novel": result.num_novel,
            "num_known": result.num_known,
            "score": result.score,
            "seconds": result.seconds,
            "beta": result.beta,
            "k_max": result.k_max,
            "approximate": result.approximate,
            "evaluations": {str(k): v[0] for k, v in result.evaluations.items()},
        }))
    return 0
