"""Where the shipped configs stand: each partition's config against UNO and the paper's algorithm (issue 14's goal).

Reads the cells of ``benchmarks/quality.py`` (nothing is trained here) and, per partition (a cached dataset), pairs
three arms over the seeds all three finished:

- **config**: the quality.py variant that trains what the dataset's shipped config sets (:data:`CONFIG_OF`; a set
  with no config of its own gets the one a user would copy, ``configs/openclipart.yaml``);
- **UNO**: ``uno``;
- **paper**: ``ncdlr`` (learned ``w(τ)``, sizes held: the paper's algorithm on the same budget).

It prints one Markdown table: per partition the three arms' novel class-mean accuracy (mean ± std over the seeds)
and known accuracy, the share of novel test images each arm predicts into a known column (mean over the seeds:
where the known/novel boundary loses them; ``seed_spread.py --routing`` has the rest of that reading), the paired
gaps config − UNO and config − paper with their SE (``seed_spread.paired_gap``: over seeds and test images
together), and issue 14's goal (novel gap to UNO ≥ +5 and above two SEs, known no more than 2 below UNO, the
config's novel seed std ≤ 2): "met", or the parts that fail. Below it, the gaps pooled
(``seed_spread.pooled_gap``: each partition weighted alike, SE ``sqrt(Σ SE²) / n``) over every partition, per set,
and over the sets the configs' settings were chosen on against the sets they were not. ``--plot`` draws the same
gaps as a forest plot (± 2 SE), a line at the goal's +5.

    .venv/bin/python benchmarks/scoreboard.py --holdout-view --seeds 5 \\
        --datasets openclipart-cached openclipart-cached-p2 fashion-cached ... tabler-cached-p1 \\
        --results-of openclipart-cached=/work/cache/quality-oc160 ... \\
        --table openclipart-cached=/work/cache/oc160-lite0-160-b1-v8 [--plot docs/img/scoreboard.png]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

import quality  # noqa: E402  (the cells, the datasets' tables)
import seed_spread  # noqa: E402  (paired_gap, pooled_gap, novel_to_known)
from ncdlr.data.features import read_class_summary, read_feature_table  # noqa: E402

#: per dataset family (a cached dataset's name up to "-cached"): the shipped config a user runs there and the
#: quality.py variant that trains what it sets on the cells' budget (tests check the two agree);
#: "chosen": whether the config's settings were chosen on this set (its rehearsals and test splits were read)
CONFIG_OF = {
    "openclipart": {"config": "configs/openclipart.yaml", "variant": "ncdlr-uniform-relax-task-cb-bound", "chosen": True},
    "fashion": {"config": "configs/fashion_mnist.yaml", "variant": "ncdlr-uniform-relax-bound", "chosen": True},
    "emoji": {"config": "configs/openclipart.yaml", "variant": "ncdlr-uniform-relax-task-cb-bound", "chosen": False},
    "tabler": {"config": "configs/openclipart.yaml", "variant": "ncdlr-uniform-relax-task-cb-bound", "chosen": False},
    "phosphor": {"config": "configs/openclipart.yaml", "variant": "ncdlr-uniform-relax-task-cb-bound", "chosen": False},
    "mdi": {"config": "configs/openclipart.yaml", "variant": "ncdlr-uniform-relax-task-cb-bound", "chosen": False},
}
UNO, PAPER = "uno", "ncdlr"
#: issue 14's goal: novel gap to UNO (points) and in SEs, known no more than this below UNO, novel seed std at most
GOAL_GAP, GOAL_SES, GOAL_KNOWN_DROP, GOAL_STD = 5.0, 2.0, 2.0, 2.0


def family(dataset: str) -> str:
    """``"openclipart"`` of ``"openclipart-cached-p2"``; ValueError for a dataset outside :data:`CONFIG_OF`."""
    name = dataset.split("-cached")[0]
    if name not in CONFIG_OF or "-cached" not in dataset:
        raise ValueError(f"no shipped config is known for {dataset!r} (cached datasets of {sorted(CONFIG_OF)})")
    return name


@dataclass
class Partition:
    """One partition's three arms over its paired seeds. Accuracies in % (class-mean over the test split)."""

    dataset: str
    seeds: list[int]
    novel: dict[str, list[float]]  #: arm -> [S] novel accuracy per seed
    known: dict[str, list[float]]  #: arm -> [S] known accuracy per seed
    to_known: dict[str, list[float]]  #: arm -> [S] share of the novel test images predicted into a known column, %
    vs_uno: dict[str, float]  #: seed_spread.paired_gap record of config − UNO
    vs_paper: dict[str, float]  #: the same of config − paper

    def goal(self) -> str:
        """Issue 14's goal on this partition: ``"met"`` or the failing parts, ``"; "``-joined."""
        return goal_status(self.vs_uno["gap"], self.vs_uno["total_se"], float(np.mean(self.known["config"])),
                           float(np.mean(self.known["uno"])), float(np.std(self.novel["config"])))


def goal_status(gap: float, se: float, known_config: float, known_uno: float, novel_std: float) -> str:
    """``"met"`` when the novel gap to UNO is ≥ :data:`GOAL_GAP` and above :data:`GOAL_SES` SEs, known accuracy is no
    more than :data:`GOAL_KNOWN_DROP` below UNO's and the novel seed std (ddof 0) ≤ :data:`GOAL_STD`; otherwise
    each failing part, e.g. ``"gap +1.3 < 5; known -2.4 < -2"``. All in points."""
    fails = []
    if gap < GOAL_GAP:
        fails.append(f"gap {gap:+.1f} < {GOAL_GAP:g}")
    if gap <= GOAL_SES * se:
        fails.append(f"gap ≤ {GOAL_SES:g} SE ({GOAL_SES * se:.1f})")
    if known_config < known_uno - GOAL_KNOWN_DROP:
        fails.append(f"known {known_config - known_uno:+.1f} < -{GOAL_KNOWN_DROP:g}")
    if novel_std > GOAL_STD:
        fails.append(f"std {novel_std:.1f} > {GOAL_STD:g}")
    return "; ".join(fails) or "met"


def partition(dataset: str, y_true: np.ndarray, num_known: int, cells: dict[str, dict[int, dict]],
              draws: int = 2000) -> Partition | None:
    """The :class:`Partition` of ``cells`` (arm "config" / "uno" / "paper" -> ``{seed: quality.py cell}``, each
    with ``test_pred [N]`` over the test split ``y_true [N]``), over the seeds all three have; None with fewer than
    two such seeds."""
    seeds = sorted(set.intersection(*(set(c) for c in cells.values())))
    if len(seeds) < 2:
        return None

    def scores(metric: str) -> dict[str, list[float]]:
        return {arm: [100 * float(c[s]["results"]["none"][metric]) for s in seeds] for arm, c in cells.items()}

    def gap(other: str) -> dict[str, float]:
        return seed_spread.paired_gap(y_true, num_known, [cells["config"][s] for s in seeds],
                                      [cells[other][s] for s in seeds], draws=draws)

    to_known = {arm: [seed_spread.novel_to_known(y_true, num_known, c[s]["test_pred"]) for s in seeds]
                for arm, c in cells.items()}
    return Partition(dataset, seeds, scores("novel"), scores("known"), to_known, gap("uno"), gap("paper"))


def pools(parts: list[Partition]) -> list[tuple[str, dict[str, float], dict[str, float]]]:
    """``[(label, pooled config − UNO, pooled config − paper)]``: over every partition, per set (with two or more
    partitions), over the sets the configs were chosen on and over the others (each where it has a partition)."""
    groups: dict[str, list[Partition]] = {f"all {len(parts)} partitions": parts}
    for name in CONFIG_OF:
        mine = [p for p in parts if family(p.dataset) == name]
        if len(mine) > 1:
            groups[f"{name} ({len(mine)})"] = mine
    for chosen, label in ((True, "sets the configs were chosen on"), (False, "sets they were not chosen on")):
        mine = [p for p in parts if CONFIG_OF[family(p.dataset)]["chosen"] is chosen]
        if mine and len(mine) < len(parts):
            groups[f"{label} ({len(mine)})"] = mine
    return [(label, seed_spread.pooled_gap([p.vs_uno for p in mine]), seed_spread.pooled_gap([p.vs_paper for p in mine]))
            for label, mine in groups.items()]


def render(parts: list[Partition]) -> str:
    """The Markdown table of :func:`partition` records and their :func:`pools`."""
    def ms(values: list[float]) -> str:
        return f"{np.mean(values):.1f} ± {np.std(values):.1f}"

    lines = ["| partition | config | seeds | novel: config / UNO / paper | known: config / UNO / paper "
             "| novel → known %: config / UNO / paper | config − UNO (SE) | config − paper (SE) | issue 14's goal |",
             "|---|---|---|---|---|---|---|---|---|"]
    for p in parts:
        known, to_known = (" / ".join(f"{np.mean(values[arm]):.1f}" for arm in ("config", "uno", "paper"))
                           for values in (p.known, p.to_known))
        lines.append(f"| {p.dataset} | {CONFIG_OF[family(p.dataset)]['variant']} | {len(p.seeds)} | "
                     f"{ms(p.novel['config'])} / {ms(p.novel['uno'])} / {ms(p.novel['paper'])} | {known} | "
                     f"{to_known} | "
                     f"{p.vs_uno['gap']:+.1f} ({p.vs_uno['total_se']:.1f}) | "
                     f"{p.vs_paper['gap']:+.1f} ({p.vs_paper['total_se']:.1f}) | {p.goal()} |")
    lines += ["", "| pooled (each partition alike) | config − UNO (SE) | config − paper (SE) |", "|---|---|---|"]
    for label, uno, paper in pools(parts):
        lines.append(f"| {label} | {uno['gap']:+.2f} ({uno['se']:.2f}) | {paper['gap']:+.2f} ({paper['se']:.2f}) |")
    return "\n".join(lines)


def plot(parts: list[Partition], path: Path) -> None:
    """A forest plot of config − UNO and config − paper (novel points, ± 2 SE) per partition and pooled, to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [(p.dataset, p.vs_uno["gap"], p.vs_uno["total_se"], p.vs_paper["gap"], p.vs_paper["total_se"])
            for p in parts]
    rows += [(f"pooled: {label}", u["gap"], u["se"], q["gap"], q["se"]) for label, u, q in pools(parts)]
    y = np.arange(len(rows))[::-1]
    fig, axes = plt.subplots(1, 2, figsize=(11, 0.42 * len(rows) + 1.4), sharey=True)
    for ax, (title, g, s) in zip(axes, (("config − UNO", 1, 2), ("config − paper's algorithm", 3, 4))):
        gaps, ses = np.array([r[g] for r in rows]), np.array([r[s] for r in rows])
        pooled = np.array([r[0].startswith("pooled") for r in rows])
        for mask, color in ((~pooled, "tab:blue"), (pooled, "black")):
            ax.errorbar(gaps[mask], y[mask], xerr=2 * ses[mask], fmt="o", color=color, capsize=3)
        ax.axvline(0, color="grey", lw=1)
        if g == 1:
            ax.axvline(GOAL_GAP, color="tab:green", ls="--", lw=1, label=f"issue 14's goal (+{GOAL_GAP:g})")
            ax.legend(loc="lower right", fontsize=8)
        ax.set_title(title)
        ax.set_xlabel("novel class-mean accuracy gap (points, ± 2 SE)")
    axes[0].set_yticks(y, [r[0] for r in rows], fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--datasets", nargs="+", required=True, choices=sorted(quality.CACHED),
                        help="the partitions (cached datasets), in the table's order")
    parser.add_argument("--seeds", type=int, default=5, help="read seeds 0..SEEDS-1 (the pairs: those all arms have)")
    parser.add_argument("--draws", type=int, default=2000, help="bootstrap draws of the test split per gap")
    parser.add_argument("--plot", type=Path, help="also write the forest plot (PNG) here")
    quality.add_cell_arguments(parser, results_of=True)
    args = parser.parse_args(argv)
    tables = quality.parsed_tables(parser, args)
    results_of = quality.parsed_results_of(parser, args)
    try:
        for dataset in args.datasets:
            family(dataset)
    except ValueError as err:
        parser.error(str(err))
    parts, missing = [], []
    for dataset in args.datasets:
        num_known, _, _, _ = read_class_summary(tables[dataset])
        y_true = read_feature_table(tables[dataset], splits=("test",)).labels["test"].numpy()
        variants = {"config": CONFIG_OF[family(dataset)]["variant"], "uno": UNO, "paper": PAPER}
        cells = {arm: {s: c for s, c in quality.read_cells(results_of.get(dataset, args.results), dataset, variant,
                                                            args.seeds, holdout_view=args.holdout_view).items()
                       if "test_pred" in c}
                 for arm, variant in variants.items()}
        p = partition(dataset, y_true, num_known, cells, draws=args.draws)
        if p is None:
            missing.append(f"{dataset} ({', '.join(f'{a} {len(c)}' for a, c in cells.items())} cells)")
        else:
            parts.append(p)
    for line in missing:
        print(f"skipped, fewer than two seeds with all three arms: {line}", file=sys.stderr)
    if not parts:
        print("no partition has two seeds with all three arms", file=sys.stderr)
        return 1
    print(render(parts))
    if args.plot:
        plot(parts, args.plot)
        print(f"\nforest plot: {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
