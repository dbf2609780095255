"""How close is the Ku estimate on long-tailed synthetic features with a known truth? (docs/estimate_k.md)

For each setting and seed: draw isotropic Gaussian classes with long-tailed sizes
(``ncdlr.estimate_k.synthetic_long_tail_features``), build one Ward tree, and run the paper's bisection with
the mixed metric (β = 0.5) and with the instance-accuracy baseline (β = 1) on the same tree.
Prints one Markdown table (per-seed estimates, mean |error|, CPU seconds of the β = 0.5 estimate: tree +
bisection; the machine is shared, so CPU time is the comparable number, wall time is printed by the CLI).

    .venv/bin/python -m benchmarks.estimate_k_synthetic [--seeds 5] [--large]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from ncdlr.estimate_k import EstimateKConfig, estimate_num_novel, synthetic_long_tail_features

SETTINGS = {
    "Ks=10 Ku=10 R=10 (2.4k rows)": dict(num_known=10, num_novel=10, n_max=300, imbalance=10.0),
    "Ks=50 Ku=50 R=50 (5.1k rows)": dict(num_known=50, num_novel=50, n_max=200, imbalance=50.0),
    "Ks=20 Ku=40 R=100 (4.0k rows)": dict(num_known=20, num_novel=40, n_max=300, imbalance=100.0),
}
LARGE = {"Ks=50 Ku=50 R=10 D=768 (98k rows)": dict(num_known=50, num_novel=50, n_max=2500, imbalance=10.0,
                                                      dim=768, separation=12.0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--large", action="store_true", help="also one ~100k-row, 768-d setting (one seed)")
    args = parser.parse_args()
    settings = dict(SETTINGS)
    if args.large:
        settings.update(LARGE)
    print("| setting | true Ku | β = 0.5 estimates | mean abs err | β = 1 estimates | mean abs err | "
          "Ward leaves | CPU s (β = 0.5) |")
    print("|---|---:|---|---:|---|---:|---:|---:|")
    for name, setting in settings.items():
        seeds = range(1 if name in LARGE else args.seeds)
        mixed, baseline, seconds, leaves = [], [], [], 0
        for seed in seeds:
            features, labels, mask = synthetic_long_tail_features(seed=seed, **setting)
            start = time.process_time()
            result, scorer = estimate_num_novel(features, labels, mask, EstimateKConfig(beta=0.5, seed=seed))
            seconds.append(time.process_time() - start)
            base, _ = estimate_num_novel(features, labels, mask, EstimateKConfig(beta=1.0), scorer=scorer)
            mixed.append(result.num_novel)
            baseline.append(base.num_novel)
            leaves = result.num_ward_leaves
        truth = setting["num_novel"]
        err = lambda xs: float(np.mean([abs(x - truth) for x in xs]))  # noqa: E731
        print(f"| {name} | {truth} | {', '.join(map(str, mixed))} | {err(mixed):.1f} | "
              f"{', '.join(map(str, baseline))} | {err(baseline):.1f} | {leaves} | {np.mean(seconds):.1f} |",
              flush=True)


if __name__ == "__main__":
    main()
