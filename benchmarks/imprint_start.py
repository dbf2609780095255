"""What a run starts from, before its first step: the seeded random head against the imprinted one
(``model.head_init imprint``), on an activation cache, per seed.

For each seed the model of ``--variant`` (quality.py's variants, the dataset's budget) is built as a run builds it
and scored twice without training: with its random head, then with the imprinted head. Scores, class-mean %:
``test known`` / ``test novel`` (task-agnostic, argmax over all K, one Hungarian matching: the headline metric) and
``train novel`` (the novel training rows' clustering over the novel columns, task-aware). Novel labels only score;
the imprint never reads them. A diagnosis of where the seeds start, not a result of training.

    .venv/bin/python benchmarks/imprint_start.py --dataset openclipart-cached \
        --table openclipart-cached=/work/cache/oc-lite0-160-b2-v8 --seeds 3
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import quality  # noqa: E402  (benchmarks/ is not a package)

from ncdlr.metrics import cluster_accuracy  # noqa: E402
from ncdlr.models import build_model  # noqa: E402
from ncdlr.service.local import embed  # noqa: E402
from ncdlr.service.run_data import init_head, model_for_table  # noqa: E402


def scores(model, splits) -> dict[str, float]:
    """``{"test known", "test novel", "train novel"}`` (class-mean %) of ``model`` as it stands (eval mode)."""
    ks = splits.num_known
    model.eval()
    with torch.no_grad():
        test_pred = model.logits(embed(model, splits.features["test"])).argmax(1).numpy()
        novel_pred = model.logits(embed(model, splits.features["novel"]))[:, ks:].argmax(1).numpy()
    model.train()
    test = cluster_accuracy(splits.labels["test"].numpy(), test_pred, ks)
    train = cluster_accuracy(splits.labels["novel"].numpy() - ks, novel_pred, 0)
    return {"test known": 100 * test["known"], "test novel": 100 * test["novel"], "train novel": 100 * train["novel"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--dataset", default="openclipart-cached", choices=sorted(quality.CACHED))
    parser.add_argument("--table", action="append", default=[], metavar="DATASET=PATH",
                        help="the cache of a dataset (as quality.py's --table)")
    parser.add_argument("--variant", default="ncdlr-uniform-relax-imprint",
                        help="a quality.py variant with model.head_init imprint (its twin's head is the random one)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1")
    args = parser.parse_args(argv)
    if quality.VARIANTS.get(args.variant, {}).get("model", {}).get("head_init") != "imprint":
        parser.error(f"--variant {args.variant!r} does not set model.head_init imprint")
    from ncdlr.data.features import read_feature_table

    splits = read_feature_table(quality.activation_tables(args.table)[args.dataset])
    rows = []
    for seed in range(args.seeds):
        cfg = quality.variant_config(args.dataset, args.variant, seed, splits, None)
        torch.manual_seed(seed)
        cfg.model.encoder = "identity"
        model_for_table(cfg, splits)
        model = build_model(cfg.model, splits.num_known, splits.num_novel, image_size=cfg.data.image_size)
        before = scores(model, splits)
        fit = init_head(cfg, model, splits)
        after = scores(model, splits)
        rows.append((seed, before, after, fit))
        print(f"seed {seed}: random head " + " ".join(f"{k} {v:.1f}" for k, v in before.items())
              + " | imprinted " + " ".join(f"{k} {v:.1f}" for k, v in after.items())
              + f" | fit known {100 * fit['fit_known']:.1f} novel {100 * fit['fit_novel']:.1f}", flush=True)
    print(f"\n| {args.dataset}, {args.seeds} seeds, before any step | " + " | ".join(rows[0][1]) + " |")
    print("|---|" + "---|" * len(rows[0][1]))
    for label, index in (("random head", 1), ("imprinted head", 2)):
        cells = [np.array([r[index][k] for r in rows]) for k in rows[0][1]]
        print(f"| {label} | " + " | ".join(f"{c.mean():.1f} ± {c.std():.1f}" for c in cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
