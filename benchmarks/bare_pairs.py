"""The bare cache command's arms over paired seeds: run ``ncdlr train --features CACHE --seed S [FLAGS]``, read them.

Sessions 62–69 compared labelers of the bare activation-cache command (no ``--config``) against UNO's bare command
(``--method.name uno`` alone) this way, from scripts that lived outside the repository. This is that protocol as
one command, so a reading in docs/results.md names a command that still exists:

- **run** (default): for each seed in turn (seed-major, so a stopped campaign leaves its first seeds), every arm's
  ``ncdlr train --features CACHE --seed S --model.head mlp FLAGS --output OUT/ARM-sS`` as a subprocess, ``--parallel``
  at a time; a run whose ``metrics.json`` exists is not run again (resumable); ``--no-start-after HH:MM`` (UTC) is a
  registered deadline: no run starts after it. Each run's console goes to ``OUT/ARM-sS.log``.
- **read** (``--read-only``, and after a run): over the seeds every arm finished, per arm the novel and known
  class-mean accuracy (%) per seed, mean ± std, novel head / medium / tail; each arm against ``--baseline`` (paired by
  seed: mean gap and its SE, ``std(d, ddof=1) / sqrt(S)``); and issue 14's goal for each arm against the baseline
  (``scoreboard.goal_status``: gap ≥ 5 and above two SEs, known no more than 2 below, novel seed std ≤ 2, ddof 0).
- **the test split** (where every read run kept its ``predictions.parquet``): per arm, the split's *resolution* —
  the binomial SE of a novel class-mean accuracy on this many test images a class (``seed_spread.resolution``),
  what one model's score would move on another split of the same size, so a seed std near it is the split's, not
  the training's; and each arm's gap to the baseline with the *test-split SE* beside the seeds' SE
  (``seed_spread.paired_gap``: a bootstrap of each novel class's test images, the runs' correctness held), which
  more seeds do not shrink.
- **the picture** (``--plot FILE``): each arm's novel accuracy per seed, the seeds' runs joined across the arms, and
  each arm's per-seed gaps to the baseline with their mean ± 2 SE against issue 14's +5.

    .venv/bin/python benchmarks/real_sets.py phosphor      # the set and its cache, from nothing
    .venv/bin/python benchmarks/bare_pairs.py --features /work/cache/phosphor-lite0-128-b1-v8 \\
        --arm bare= --arm "uno=--method.name uno" --seeds 0-4 --parallel 2 --out runs/bare-phosphor
    .venv/bin/python benchmarks/bare_pairs.py --features … --seeds 0-4 --out runs/bare-phosphor --read-only \\
        --plot runs/bare-phosphor/pairs.png

Nothing is timed: runs share the machine and their wall time is printed only as a record.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE)]

from scoreboard import GOAL_GAP, goal_status  # noqa: E402  (issue 14's goal, as the configs' scoreboard reads it)

GROUPS = ("head", "medium", "tail")  #: the novel classes' groups by training count (3:4:3), as metrics.json has them


@dataclass(frozen=True)
class Arm:
    """One arm: its name (the run folders' prefix) and the ``ncdlr train`` flags it adds to the bare command."""

    name: str
    flags: tuple[str, ...]


def parse_arm(text: str) -> Arm:
    """``"uno=--method.name uno"`` → ``Arm("uno", ("--method.name", "uno"))``; ``"bare="`` is the bare command.
    ValueError for a missing ``=``, an empty name or one that is not a plain folder name."""
    name, sep, flags = text.partition("=")
    name = name.strip()
    if not sep or not name or not name.replace("-", "").replace("_", "").isalnum():
        raise ValueError(f"--arm takes NAME=FLAGS with a plain name (letters, digits, - and _), got {text!r}")
    return Arm(name, tuple(shlex.split(flags)))


def parse_seeds(text: str) -> list[int]:
    """``"0-4"`` → ``[0, 1, 2, 3, 4]``, ``"0,2,5"`` → ``[0, 2, 5]``; ValueError for anything else or a repeated or
    negative seed."""
    try:
        if "-" in text:
            lo, hi = (int(part) for part in text.split("-", 1))
            seeds = list(range(lo, hi + 1))
        else:
            seeds = [int(part) for part in text.split(",")]
    except ValueError:
        raise ValueError(f"--seeds takes A-B or a comma list of integers, got {text!r}") from None
    if not seeds or min(seeds) < 0 or len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds needs distinct seeds ≥ 0, got {text!r}")
    return seeds


def run_dir(out: Path, arm: Arm, seed: int) -> Path:
    return out / f"{arm.name}-s{seed}"


def train_command(features: str, arm: Arm, seed: int, out: Path, python: str = sys.executable) -> list[str]:
    """One run: ``python -m ncdlr.cli train --features … --seed S --model.head mlp FLAGS --output …``.
    The ``mlp`` head is what the bare cache command trains anyway (stated, so the run's config names it)."""
    return [python, "-m", "ncdlr.cli", "train", "--features", features, "--seed", str(seed), "--model.head", "mlp",
            *arm.flags, "--output", str(run_dir(out, arm, seed))]


def past(deadline: str | None, now: datetime | None = None) -> bool:
    """Whether UTC ``now`` is after ``deadline`` (``"HH:MM"``, today); False without one. ValueError for a time
    that is not ``HH:MM`` on a 24-hour clock."""
    if deadline is None:
        return False
    try:
        hour, minute = (int(part) for part in deadline.split(":"))
    except ValueError:
        raise ValueError(f"--no-start-after takes HH:MM (UTC), got {deadline!r}") from None
    if not (0 <= hour < 24 and 0 <= minute < 60):
        raise ValueError(f"--no-start-after takes HH:MM (UTC), got {deadline!r}")
    now = now or datetime.now(timezone.utc)
    return (now.hour, now.minute) > (hour, minute)


def run_all(features: str, arms: list[Arm], seeds: list[int], out: Path, parallel: int, deadline: str | None) -> int:
    """Seed-major, ``parallel`` runs at a time (a later seed's run starts as soon as a slot frees); prints one line a
    run. The number of runs that failed."""
    out.mkdir(parents=True, exist_ok=True)
    failed = 0

    def one(arm: Arm, seed: int) -> int:
        folder = run_dir(out, arm, seed)
        if (folder / "metrics.json").is_file():
            print(f"{folder.name}: done before, kept", flush=True)
            return 0
        if past(deadline):
            print(f"{folder.name}: not started (after the deadline {deadline} UTC)", flush=True)
            return 0
        start = time.monotonic()
        with open(out / f"{folder.name}.log", "w") as log:
            code = subprocess.run(train_command(features, arm, seed, out), stdout=log, stderr=subprocess.STDOUT,
                                  cwd=ROOT).returncode
        print(f"{folder.name}: exit {code} after {time.monotonic() - start:.0f} s", flush=True)
        return int(code != 0)

    # every run queued at once, seed-major: runs start in that order and a slot that frees takes the next one, so
    # an arm added beside finished ones keeps ``parallel`` of its seeds running (a pool per seed ran them one by one)
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        jobs = [pool.submit(one, arm, seed) for seed in seeds for arm in arms]
        failed += sum(job.result() for job in jobs)
    return failed


def read_runs(out: Path, arms: list[Arm], seeds: list[int]) -> tuple[list[int], dict[str, dict[int, dict]]]:
    """``(paired seeds, {arm: {seed: metrics.json}})`` over the seeds every arm finished."""
    found = {arm.name: {s: json.loads((run_dir(out, arm, s) / "metrics.json").read_text()) for s in seeds
                        if (run_dir(out, arm, s) / "metrics.json").is_file()} for arm in arms}
    paired = [s for s in seeds if all(s in found[arm.name] for arm in arms)]
    return paired, {name: {s: runs[s] for s in paired} for name, runs in found.items()}


def read_predictions(out: Path, arms: list[Arm], seeds: list[int]) -> tuple[object, dict[str, list], int] | None:
    """``(y_true [N], {arm: [y_pred [N] per seed]}, Ks)`` from the runs' ``predictions.parquet`` (the test split,
    rows put in ``source_id`` order so that seeds line up image by image; ``Ks`` the known classes, from the file's
    ``ncdlr_report`` metadata), or None if a run lacks the file. ValueError if two runs did not predict the same test
    images with the same labels."""
    import numpy as np
    import pyarrow.parquet as pq

    y_true, preds = None, {}
    for arm in arms:
        preds[arm.name] = []
        for seed in seeds:
            path = run_dir(out, arm, seed) / "predictions.parquet"
            if not path.is_file():
                return None
            table = pq.read_table(path, columns=["source_id", "y_true", "y_pred"])
            report = json.loads(table.schema.metadata[b"ncdlr_report"])
            table = table.sort_by("source_id")
            truth = np.asarray(table["y_true"])
            if y_true is None:
                y_true, ids, num_known = truth, table["source_id"], int(report["num_known"])
            elif not (table["source_id"].equals(ids) and np.array_equal(truth, y_true)):
                raise ValueError(f"{path} predicts other test images than {arms[0].name}-s{seeds[0]}")
            preds[arm.name].append(np.asarray(table["y_pred"]))
    return y_true, preds, num_known


def render_test_split(y_true, preds: dict[str, list], num_known: int, baseline: str) -> str:
    """The test split's lines (%): per arm the novel accuracy's resolution, and its gap to ``baseline`` with the
    seeds' SE, the test split's SE and both together (:func:`seed_spread.paired_gap`)."""
    import numpy as np
    from seed_spread import paired_gap, per_class_accuracy, resolution

    from ncdlr.metrics import correct_under_matching

    novel = [int(c) for c in np.unique(y_true) if c >= num_known]
    sizes = [int((y_true == c).sum()) for c in novel]
    lines = [f"the test split: {len(novel)} novel classes, {sum(sizes)} images ({min(sizes)}–{max(sizes)} a class)", "",
             f"| arm | novel resolution (binomial SE) | novel − {baseline}: seeds' SE | test split's SE | both |",
             "|---|---|---|---|---|"]
    # each run's test images scored once under its own matching: {arm: [S, N] bool}
    correct = {arm: np.stack([correct_under_matching(y_true, pred) for pred in runs]) for arm, runs in preds.items()}
    for arm, runs in preds.items():
        res = resolution(per_class_accuracy(correct[arm], y_true, novel) * 100, y_true, novel)
        cells = ["", "", ""]
        if arm != baseline and len(runs) >= 2:
            gap = paired_gap(y_true, num_known, list(correct[arm]), list(correct[baseline]), correct=lambda row: row)
            cells = [f"{gap['gap']:+.2f} ({gap['seed_se']:.2f})", f"{gap['sample_se']:.2f}", f"{gap['total_se']:.2f}"]
        lines.append(f"| {arm} | {res:.2f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def mean_std(values: list[float], ddof: int = 1) -> tuple[float, float]:
    """Mean and std (``ddof`` 1: the sample std, 0: the population std; NaN where it is undefined)."""
    std = statistics.stdev if ddof else statistics.pstdev
    return statistics.fmean(values), std(values) if len(values) > ddof else float("nan")


def paired(a: list[float], b: list[float]) -> tuple[float, float]:
    """Mean of ``a[i] − b[i]`` and its SE ``std(d, ddof=1) / sqrt(n)`` (points)."""
    mean, std = mean_std([x - y for x, y in zip(a, b)])
    return mean, std / math.sqrt(len(a))


def render(seeds: list[int], runs: dict[str, dict[int, dict]], baseline: str) -> str:
    """The Markdown reading of :func:`read_runs`' result (accuracies in %)."""
    def pct(arm: str, key: str) -> list[float]:
        return [100 * float(runs[arm][s][key]) for s in seeds]

    lines = [f"seeds read (finished by every arm): {', '.join(map(str, seeds))}", "",
             "| seed | " + " | ".join(f"{arm} novel / known" for arm in runs) + " |",
             "|---|" + "---|" * len(runs)]
    for s in seeds:
        lines.append(f"| {s} | " + " | ".join(f"{100 * runs[arm][s]['novel']:.1f} / {100 * runs[arm][s]['known']:.1f}"
                                             for arm in runs) + " |")
    lines += ["", "| arm | novel mean ± std (ddof 1) | known mean ± std | novel head / medium / tail | "
              f"novel − {baseline} (SE) | known − {baseline} (SE) | issue 14's goal against {baseline} |",
              "|---|---|---|---|---|---|---|"]
    for arm in runs:
        novel, known = pct(arm, "novel"), pct(arm, "known")
        groups = " / ".join(f"{mean_std(pct(arm, f'novel_{g}'))[0]:.1f}" for g in GROUPS)
        if arm == baseline or len(seeds) < 2:
            versus = ("", "", "")
        else:
            gap, se = paired(novel, pct(baseline, "novel"))
            known_gap, known_se = paired(known, pct(baseline, "known"))
            goal = goal_status(gap, se, mean_std(known)[0], mean_std(pct(baseline, "known"))[0], mean_std(novel, 0)[1])
            versus = (f"{gap:+.2f} ({se:.2f})", f"{known_gap:+.2f} ({known_se:.2f})", goal)
        lines.append(f"| {arm} | {mean_std(novel)[0]:.2f} ± {mean_std(novel)[1]:.2f} | "
                     f"{mean_std(known)[0]:.2f} ± {mean_std(known)[1]:.2f} | {groups} | " + " | ".join(versus) + " |")
    return "\n".join(lines)


def gaps(seeds: list[int], runs: dict[str, dict[int, dict]], baseline: str) -> dict[str, dict]:
    """Per arm but the baseline: ``{"per_seed": [S] novel gaps (points) to the baseline, "mean", "se"}`` (paired by
    seed, :func:`paired`; ``se`` NaN under two seeds)."""
    def novel(arm: str) -> list[float]:
        return [100 * float(runs[arm][s]["novel"]) for s in seeds]

    out = {}
    for arm in runs:
        if arm != baseline:
            mean, se = paired(novel(arm), novel(baseline))
            out[arm] = {"per_seed": [a - b for a, b in zip(novel(arm), novel(baseline))], "mean": mean, "se": se}
    return out


def plot(seeds: list[int], runs: dict[str, dict[int, dict]], baseline: str, path: Path) -> None:
    """The reading as a picture, to ``path`` (PNG): left, every arm's novel accuracy (%) per seed, each seed's runs
    joined across the arms; right, each arm's per-seed novel gaps to ``baseline`` (points) with their mean ± 2 SE,
    beside 0 and issue 14's +5."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = list(runs)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6), gridspec_kw={"width_ratios": [1.2, 1]})
    for s in seeds:
        left.plot(range(len(arms)), [100 * float(runs[a][s]["novel"]) for a in arms], "o-", lw=1, alpha=0.8,
                  label=f"seed {s}")
    left.set_xticks(range(len(arms)), arms)
    left.set_ylabel("novel class-mean accuracy (%)")
    left.set_title("per seed")
    left.legend(fontsize=7, ncol=2)
    rows = gaps(seeds, runs, baseline)
    for y, (arm, row) in enumerate(rows.items()):
        right.plot(row["per_seed"], [y] * len(row["per_seed"]), "o", color="tab:blue", alpha=0.5)
        right.errorbar([row["mean"]], [y], xerr=None if math.isnan(row["se"]) else [2 * row["se"]], fmt="D",
                       color="black", capsize=4)
    right.axvline(0, color="grey", lw=1)
    right.axvline(GOAL_GAP, color="tab:green", ls="--", lw=1, label=f"issue 14's goal (+{GOAL_GAP:g})")
    right.set_yticks(range(len(rows)), [f"{arm} − {baseline}" for arm in rows])
    right.set_ylim(-0.7, len(rows) - 0.3)
    right.set_xlabel("novel gap (points): seeds, mean ± 2 SE")
    right.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--features", required=True, help="the activation cache (an `ncdlr embed` table)")
    parser.add_argument("--arm", action="append", dest="arms", metavar="NAME=FLAGS",
                        help="an arm: its folder name and the flags it adds (repeat); default: bare= and "
                             "'uno=--method.name uno'")
    parser.add_argument("--baseline", default=None, help="the arm every other is paired against (default: the last)")
    parser.add_argument("--seeds", default="0-2", help="A-B or a comma list (default 0-2)")
    parser.add_argument("--parallel", type=int, default=2, help="runs at a time (default 2: two cores)")
    parser.add_argument("--out", required=True, type=Path, help="folder of the runs (ARM-sS) and their logs")
    parser.add_argument("--no-start-after", default=None, metavar="HH:MM", help="UTC time after which no run starts")
    parser.add_argument("--read-only", action="store_true", help="read the runs in --out; train nothing")
    parser.add_argument("--plot", type=Path, default=None, metavar="FILE",
                        help="also draw the reading (PNG): novel accuracy per seed and arm, and each arm's gaps to the "
                             "baseline with their mean ± 2 SE")
    args = parser.parse_args(argv)
    try:
        arms = [parse_arm(text) for text in (args.arms or ["bare=", "uno=--method.name uno"])]
        seeds = parse_seeds(args.seeds)
        if args.parallel < 1:
            raise ValueError(f"--parallel must be ≥ 1, got {args.parallel}")
        if len({arm.name for arm in arms}) != len(arms):
            raise ValueError("two arms share a name")
        baseline = args.baseline or arms[-1].name
        if baseline not in {arm.name for arm in arms}:
            raise ValueError(f"--baseline {baseline!r} is not an arm ({', '.join(arm.name for arm in arms)})")
        if args.no_start_after is not None:
            past(args.no_start_after)  # a malformed time fails here, before any run
    except ValueError as err:
        parser.error(str(err))
    failed = 0 if args.read_only else run_all(args.features, arms, seeds, args.out, args.parallel, args.no_start_after)
    paired_seeds, runs = read_runs(args.out, arms, seeds)
    if not paired_seeds:
        print(f"no seed finished by every arm in {args.out}", file=sys.stderr)
        return 1
    print(render(paired_seeds, runs, baseline))
    if args.plot is not None:
        plot(paired_seeds, runs, baseline, args.plot)
        print(f"\nthe picture: {args.plot}")
    found = read_predictions(args.out, arms, paired_seeds)
    if found is not None:
        print("\n" + render_test_split(*found, baseline))
    return int(failed > 0)


if __name__ == "__main__":
    raise SystemExit(main())
