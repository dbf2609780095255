"""Ray Tune search for γ (cluster-size prior strength) and α (novel-loss weight) on a known-class validation split.

Usage:
  python tuning/gamma_search.py                       # embedded default: synthetic long-tailed features, 2 cores
  python tuning/gamma_search.py --features s3://bucket/features.parquet --config configs/openclipart.yaml \\
      --num-samples 32 --cpus-per-trial 4 --gpus-per-trial 0.5 --storage s3://bucket/tune --epochs 20

Validation protocol (never looks at novel labels; ncdlr.service.validation):
  Only the `known` rows of the feature table are read. A seeded 20 % (--pseudo-novel-fraction) of the Ks known
  classes becomes pseudo-novel, chosen across head / medium / tail (3:4:3 by training count) so the long tail is
  kept; their labels are hidden during the trial (they form the unlabeled `novel` split). In every class a seeded
  20 % (--holdout-fraction) of the images is held out (split `val`) and never trained on. Trials train the real
  trainer on this table: the remaining known classes are labeled, pseudo-known labels 0..Ks'-1, pseudo-novel
  Ks'..Ks'+Ku'-1. Score = class-mean accuracy over the pseudo-novel classes of `val` after one Hungarian matching
  over all classes (ncdlr.metrics.cluster_accuracy "novel"); head/medium/tail of it are reported too. The
  validation table is written once to <storage>/<name>/validation.parquet.
  With --problem planted the pseudo-novel classes are planted in the real unlabeled pool instead: the table's
  `novel` split is their training rows plus every novel row of the feature table (read for their embeddings;
  their labels are replaced by a placeholder before anything uses them), the trials have Ku' + Ku clusters, and the
  score is the planted classes' mean F1 against the clusters of the whole pool (ncdlr.metrics.planted_f1; a split,
  a merge with an unlabeled class and a cluster that swallows the pool all lower it). It keeps the real
  problem's sizes, long tail and number of clusters, which a few known classes posed alone do not; it is the
  rehearsal docs/tuning.md recommends for the cluster sizes (--reg-m 0 0.45). A config's post-hoc fix
  (method.posthoc) is applied before scoring, fitted on the validation table's training rows.

Each trial trains the real run's step: its whole batch (data.batch_size × run.num_workers) and its buffer are
scaled by n'/n (the validation problem's novel rows over the table's, at most 1), as the in-process rehearsal
scales them, so a trial's epoch has as many steps as a real one; that batch is split over --workers-per-trial.

Search space:
  γ log-uniform over [--gamma-min, --gamma-max] (default 50..5000, the paper's scale), plus the
  uniform-prior limit γ = ∞ (labeler.prior = uniform, α = 1) as an explicit first candidate; α uniform over
  [0.25, 4] (--alpha-min/--alpha-max). γ, α and the prior are what the search sets: --gamma, --alpha and
  --prior are refused here.
  γ is searched in the units of the config you will train with (Ku novel classes). Because the labeler's
  objective divides the KL term by Ku, γ's pull grows as Ku shrinks (method.md §4 trap a); a trial on the
  pseudo-novel problem (Ku' classes) therefore runs with γ·Ku'/Ku, the same γ/Ku (turn off with
  --gamma-transfer none). For small Ku (tens of classes) the whole default range pins τ ≈ 1, i.e. behaves like
  the uniform prior — small Ku needs small γ: lower --gamma-min/--gamma-max (the embedded default searches
  1..1000 for its Ku = 20).
  With --reg-m R1 R2 ... the cluster-size relaxation labeler.reg_m is searched too (a choice among the values,
  e.g. 0 0.45), and the uniform candidate is tried with each value: the uniform prior with reg_m > 0 solves the
  paper's relaxed OT exactly (docs/results.md, session 22).
  ASHA (ray.tune.schedulers.ASHAScheduler, time attribute = epoch) stops poor trials early.

Each trial runs the real trainer (ncdlr.service.tune): a Tune function trainable builds a Ray Train
TorchTrainer around the trainer's worker function in feature-table mode, and a Train callback scores every
epoch's checkpoint on `val` and forwards the metrics to Tune. Trials are resumable: rerunning the same command
(same --storage and --name) restores the Tune experiment (Tuner.restore) and each unfinished trial's
TorchTrainer resumes from its last checkpoint.

Outputs (in --output): trials.md / trials.csv (the ranked table, also printed), best.yaml (the best config —
the base config with labeler.gamma/labeler.prior/optim.alpha set; `ncdlr train --config best.yaml` and
`python -m ncdlr.train_inat2k --config best.yaml` accept it unchanged), gamma_scores.png (score vs γ, the
uniform limit as a separate marker) and search.json. Any other config field (--epochs, --batch-size,
--optim.lr, ...) can be given to set the trials' base config.
"""

from __future__ import annotations

import argparse
import copy
import csv
import json
import math
import sys
import time
from dataclasses import asdict
from pathlib import Path

if __package__ in (None, ""):  # `python tuning/gamma_search.py`: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ncdlr.data.features import ACTIVATIONS, read_metadata, read_split_counts  # noqa: E402
from ncdlr.service.config import (Config, ConfigError, Setting, add_override_arguments, load_yaml,  # noqa: E402
                                  save_config)
from ncdlr.service.entry import config_from_args, init_ray, run_main  # noqa: E402
from ncdlr.service.tune import (ExperimentStorage, SearchSpace, TrialSettings, apply_trial_params,  # noqa: E402
                                fit_search, make_tuner, new_trial_settings, restore_tuner, set_ray_env_defaults,
                                trial_base, trial_rows)
from ncdlr.service.validation import (ValidationConfig, ValidationSplit, build_validation_table,  # noqa: E402
                                      read_validation_split)

PROG = "gamma_search"
EMBEDDED_GAMMA_RANGE = (1.0, 1000.0)  #: Ku = 20 in the embedded default: the paper's 50..5000 would pin τ ≈ 1
SEARCHED = ("labeler.gamma", "labeler.gamma_per_cluster", "labeler.prior", "optim.alpha")  #: set by every trial and in best.yaml
TABLE, SETTINGS = "validation.parquet", "search_settings.json"  #: inside the experiment


# -- the data: a feature table, or the embedded synthetic default ----------------------------------------------

def embedded_default(out_dir: Path, seed: int = 0) -> tuple[str, list[Setting]]:
    """Write the embedded default's feature table; return it with the settings of its base config.

    The table is the synthetic long-tailed problem of :mod:`ncdlr.experiments.synthetic` (Ks = Ku = 20
    classes, 600 → 12 images per class, signal hidden under larger nuisance dimensions, so the head must
    learn from labels); the base config trains an MLP head on it for 8 epochs.
    """
    import numpy as np

    from ncdlr.data.features import write_feature_table
    from ncdlr.experiments import synthetic

    problem = synthetic.Setting(n_max=600)  # ≈ 480 pseudo-novel training rows: ≈ 15 steps of 32 per epoch
    path = out_dir / "data" / f"synthetic-features-seed{seed}.parquet"
    if not path.is_file():
        known, novel, test, _ = synthetic.make_data(problem, seed)
        parts = ((known, "known"), (novel, "novel"), (test, "test"))
        x = np.concatenate([p.x.numpy() for p, _ in parts])
        y = np.concatenate([p.y.numpy() for p, _ in parts])
        splits = sum(([name] * len(p.y) for p, name in parts), [])
        write_feature_table(str(path), x, y, splits, num_known=problem.num_known, num_novel=problem.num_novel,
                            extra={"dataset": "ncdlr.experiments.synthetic", "seed": seed})
    values = {"data.features": str(path), "data.batch_size": 32, "data.feature_noise": problem.view_noise,
              "model.encoder": "identity", "model.head": "mlp", "labeler.buffer_size": 512, "optim.epochs": 8,
              "optim.lr": 1e-2, "optim.min_lr": 1e-3, "optim.warmup_epochs": 1.0, "run.log_every": 0}
    return str(path), [Setting(key, value) for key, value in values.items()]


def base_config(args: argparse.Namespace, output: Path) -> tuple[str, Config]:
    """The feature table searched on and the config of the run you will train (best.yaml is it with γ/α set)."""
    if args.features:
        settings = [Setting("data.features", args.features)]
        if not args.config:  # a bare feature table: train a head on the embeddings
            settings += [Setting("model.encoder", "identity"), Setting("model.head", "mlp")]
        source = args.features
    else:
        source, settings = embedded_default(output, args.val_seed)
        if args.config:  # the user's config, trained on the embedded table
            settings = [Setting("data.features", source)]
        print(f"[{PROG}] embedded default: synthetic long-tailed feature table {source}", flush=True)
    if args.verbose:
        settings.append(Setting("run.verbose", True))
    return source, config_from_args(args, settings=settings)


def feature_mode(cfg: Config, activations: bool = False) -> Config:
    """The trials' base: a copy of ``cfg`` with as many clusters as the validation table has (``model.num_novel``
    from the table). On an embedding table it trains a head on the embeddings (encoder ``identity``; linear/mlp
    kept). On an activation cache (``activations``) it trains what the run will train, the config's last
    ``model.trainable_blocks`` blocks and its head, on the cached activations (``model_for_table`` checks them
    against the cache)."""
    out = copy.deepcopy(cfg)
    out.model.num_novel = "0"
    if activations:
        return out
    out.model.encoder, out.model.pretrained, out.model.trainable_blocks = "identity", "", 0
    if out.model.head not in ("linear", "mlp"):
        out.model.head = "mlp"
    return out


def validation_split(args: argparse.Namespace, source: str, storage: ExperimentStorage) -> ValidationSplit:
    """The experiment's validation table: built once from ``source``'s known rows (and its novel rows, labels
    replaced, with ``--problem planted``), reused when it exists; an experiment of the other problem is refused."""
    planted = args.problem == "planted"
    if storage.exists(TABLE):
        print(f"[{PROG}] reusing validation table {storage.child(TABLE)}", flush=True)
        split = read_validation_split(storage.child(TABLE))
        if split.planted != planted:
            raise ConfigError(f"the experiment at {storage.uri} was made with --problem "
                              f"{'planted' if split.planted else 'known'}, not {args.problem}; give another --name "
                              f"(or --storage) for a search on the other problem")
    else:
        split = build_validation_table(source, storage.child(TABLE), ValidationConfig(
            args.pseudo_novel_fraction, args.holdout_fraction, args.val_seed), num_novel=args.num_novel,
            planted=planted)
    where = f", planted among {split.unlabeled_rows} novel rows" if split.planted else ""
    print(f"[{PROG}] validation split of the {split.target_num_known} known classes: {split.num_known} pseudo-known, "
          f"{split.num_novel} pseudo-novel {split.pseudo_novel}{where}; rows {split.split_counts}; "
          f"{split.num_clusters} clusters per trial; target Ku = {split.target_num_novel}", flush=True)
    return split


# -- the search on Ray Tune ----------------------------------------------------------------------------------------

def search_space(args: argparse.Namespace) -> SearchSpace:
    gmin, gmax = EMBEDDED_GAMMA_RANGE if not args.features else (50.0, 5000.0)
    space = SearchSpace(gmin if args.gamma_min is None else args.gamma_min,
                        gmax if args.gamma_max is None else args.gamma_max,
                        args.alpha_min, args.alpha_max, not args.no_uniform, tuple(args.reg_m or ()))
    space.check()
    return space


def max_concurrent(args: argparse.Namespace) -> int:
    """--max-concurrent, else as many trials as the cluster's CPUs hold (at most 2 on the embedded default)."""
    import ray

    if args.max_concurrent:
        return args.max_concurrent
    fits = max(1, int(ray.cluster_resources().get("CPU", 1) // max(args.cpus_per_trial, 0.01)))
    return fits if args.features else min(fits, 2)


def tune_search(args: argparse.Namespace, base: Config, split: ValidationSplit, storage: ExperimentStorage,
                space: SearchSpace, source: str):
    """Resume the stored search, or start one; ``(settings, Tune ResultGrid)`` when it returns. A new search's
    trials take the real run's whole step batch and buffer scaled by n'/n (:func:`~ncdlr.service.tune.trial_base`;
    n = the novel rows of ``source``, counted from its split column alone)."""
    if storage.can_restore():
        settings = TrialSettings.from_json(storage.read_text(SETTINGS))
        print(f"[{PROG}] resuming the experiment at {storage.uri} (its search space and settings are kept)",
              flush=True)
        return settings, fit_search(restore_tuner(settings, storage), settings)
    if args.resume:
        raise ConfigError(f"--resume given but there is no experiment to resume at {storage.uri}")
    trials = feature_mode(base, read_metadata(storage.child(TABLE)).get("kind") == ACTIVATIONS)
    trials.data.features = storage.child(TABLE)
    real_rows = read_split_counts(source).get("novel", 0)
    trials = trial_base(trials, split.split_counts["novel"], real_rows, args.workers_per_trial)
    print(f"[{PROG}] each trial's step: {trials.data.batch_size} known + {trials.data.batch_size} novel rows on each "
          f"of {trials.run.num_workers} worker(s), buffer {trials.labeler.buffer_size} rows: the run's "
          f"{base.data.batch_size} × {max(1, base.run.num_workers)} worker(s) and buffer {base.labeler.buffer_size}, "
          f"scaled by min(1, n'/n), n'/n = {split.split_counts['novel']}/{real_rows or split.split_counts['novel']} novel rows",
          flush=True)
    settings = new_trial_settings(trials, storage, target_num_novel=split.target_num_novel,
                                  val_num_novel=split.num_clusters, gamma_transfer=args.gamma_transfer == "ku",
                                  workers=args.workers_per_trial, cpus_per_trial=args.cpus_per_trial,
                                  gpus_per_trial=args.gpus_per_trial)
    storage.write_text(SETTINGS, settings.to_json())
    concurrent = max_concurrent(args)
    tuner = make_tuner(settings, storage, space, num_samples=args.num_samples, max_concurrent=concurrent,
                       grace_period=args.grace_period, reduction_factor=args.reduction_factor, seed=args.search_seed)
    print(f"[{PROG}] {args.num_samples} trials, {concurrent} at a time, {trials.optim.epochs} epochs each (ASHA), "
          f"γ ∈ [{space.gamma_min:g}, {space.gamma_max:g}]" + (" + uniform" if space.include_uniform else "")
          + f", α ∈ [{space.alpha_min:g}, {space.alpha_max:g}]"
          + (f", labeler.reg_m ∈ {{{', '.join(f'{r:g}' for r in space.reg_m)}}}" if space.reg_m else "")
          + f", storage {storage.uri}", flush=True)
    return settings, fit_search(tuner, settings)


# -- results: ranking, best config, plot -----------------------------------------------------------------------

def rank_trials(rows: list[dict]) -> list[dict]:
    """Most epochs first (ASHA stops the weaker trials at a rung), then the highest last score."""
    def key(row):
        score = row.get("score")
        return (-(row.get("epoch") or 0), -(score if score is not None and not math.isnan(score) else -1.0))

    ranked = sorted(rows, key=key)
    for i, row in enumerate(ranked, 1):
        row["rank"] = i
    return ranked


COLUMNS = ("rank", "trial", "gamma", "gamma_trial", "alpha", "reg_m", "epoch", "score", "score_head", "score_medium",
           "score_tail", "val_all", "tau", "status")
#: the columns of a search on the planted problem: its score has no head / medium / tail parts and no ``val``
PLANTED_COLUMNS = ("rank", "trial", "gamma", "gamma_trial", "alpha", "reg_m", "epoch", "score", "score_min", "tau",
                   "status")
HEADS = {"rank": "rank", "trial": "trial", "gamma": "γ", "gamma_trial": "γ (trial)", "alpha": "α",
         "reg_m": "reg_m (sizes)", "epoch": "epochs", "score": "score (pseudo-novel)", "score_head": "H",
         "score_medium": "M", "score_tail": "T", "val_all": "val all", "tau": "τ", "status": "status",
         "score_min": "worst planted class"}


def columns(planted: bool) -> tuple[str, ...]:
    """The table's columns for a search on the planted problem or on the known-class one."""
    return PLANTED_COLUMNS if planted else COLUMNS


def _cell(column: str, value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if column in ("gamma", "gamma_trial"):
        return "∞ (uniform)" if math.isinf(value) else f"{value:.4g}"
    if column == "epoch":
        return str(int(value))
    if column == "reg_m":
        return "held" if value == 0 else f"{value:g}"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def format_table(rows: list[dict], planted: bool = False) -> str:
    """The ranked trials as a Markdown table (γ = ∞ is the uniform-prior limit); ``planted``: a search on the
    planted problem (score = the planted classes' mean F1)."""
    cols, heads = columns(planted), {**HEADS, "score": "score (planted F1)"} if planted else HEADS
    head = [heads[c] for c in cols]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(_cell(col, row.get(col)) for col in cols) + " |" for row in rows]
    return "\n".join(lines)


def _sizes_label(reg_m: float) -> str:
    return "sizes held" if not reg_m else f"reg_m {reg_m:g}"


def plot_scores(rows: list[dict], path: Path, space: SearchSpace, planted: bool = False) -> list[str]:
    """Score vs γ (log x) for the finite γ; the uniform limit as star markers right of the range. When the size
    relaxation was searched, each ``reg_m`` value has its own marker and legend entry. Returns the legend's labels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    scored = [r for r in rows if r.get("score") is not None]
    def reg_m_of(row: dict) -> float:
        return float(row.get("reg_m") or 0.0)

    values = sorted({reg_m_of(r) for r in scored})
    shapes = dict(zip(values, ("o", "s", "^", "D", "v", "P")))
    stars = dict(zip(values, ("crimson", "darkorange", "purple", "teal", "black", "gray")))
    points = None
    x_uniform = space.gamma_max * 3
    for reg_m in values:
        group = [r for r in scored if reg_m_of(r) == reg_m]
        finite = [r for r in group if math.isfinite(r["gamma"])]
        suffix = f", {_sizes_label(reg_m)}" if len(values) > 1 else ""
        if finite:
            points = ax.scatter([r["gamma"] for r in finite], [r["score"] for r in finite],
                                marker=shapes.get(reg_m, "o"), c=[r["alpha"] for r in finite], cmap="viridis",
                                vmin=space.alpha_min,
                                vmax=space.alpha_max, s=[18 + 6 * (r.get("epoch") or 0) for r in finite],
                                label=f"γ finite{suffix}" if suffix else None)
        uniform = [r["score"] for r in group if math.isinf(r["gamma"])]
        if uniform:
            ax.scatter([x_uniform] * len(uniform), uniform, marker="*", s=220, color=stars.get(reg_m, "crimson"),
                       label=f"uniform prior (γ = ∞){suffix}")
    if points is not None:
        fig.colorbar(points, ax=ax, label="α")
    ax.set_xscale("log")
    ax.set_xlim(space.gamma_min / 1.5, x_uniform * 1.8)
    ax.set_xlabel("γ (config units; marker size = epochs trained)")
    ax.set_ylabel("planted classes' mean F1 in the pool" if planted else "pseudo-novel class-mean accuracy")
    ax.set_title("γ/α search, known classes planted in the pool" if planted
                 else "γ/α search on the known-class validation split")
    labels = ax.get_legend_handles_labels()[1]
    if labels:
        ax.legend(loc="best", fontsize="small")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return labels


def write_best_config(base: Config, best: dict, path: Path, note: str) -> Config:
    """Write ``base`` with the best γ/α (and ``reg_m``, when the row has it) as YAML, re-load it with the trainer's
    loader and return it."""
    save_config(apply_trial_params(base, best["gamma"], best["alpha"], best.get("reg_m")), path)
    path.write_text("".join(f"# {line}\n" for line in note.splitlines()) + path.read_text())
    return load_yaml(path)  # the trainer's own loader: raises ConfigError if the file would be refused


def write_table(rows: list[dict], output: Path, space: SearchSpace, planted: bool = False) -> None:
    """Print the ranked table; write trials.md, trials.csv and gamma_scores.png."""
    table = format_table(rows, planted)
    print(table)
    (output / "trials.md").write_text(table + "\n")
    with open(output / "trials.csv", "w", newline="") as handle:
        extra = ["loss"] if planted else ["val_known", "loss"]
        writer = csv.DictWriter(handle, fieldnames=list(columns(planted)) + extra, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    plot_scores(rows, output / "gamma_scores.png", space, planted)


def best_note(args: argparse.Namespace, best: dict, rows: list[dict], split: ValidationSplit, unfinished: int) -> str:
    prior = "uniform prior (γ = ∞)" if math.isinf(best["gamma"]) else f"γ = {best['gamma']:.4g}"
    return (f"Best of {len(rows)} trials{' (search unfinished)' if unfinished else ''} of tuning/gamma_search.py "
            f"({args.name}): {prior}, α = {best['alpha']:.3g}, labeler.reg_m = {best.get('reg_m', 0.0):g};\n"
            + (f"planted classes' mean F1 {best['score']:.4f} in the real pool\n({split.num_known} pseudo-known / "
               f"{split.num_novel} planted classes of {split.source}, among its {split.unlabeled_rows} novel rows).\n"
               if split.planted else
               f"pseudo-novel class-mean accuracy {best['score']:.4f} on the known-class validation split\n"
               f"({split.num_known} pseudo-known / {split.num_novel} pseudo-novel classes of {split.source}).\n")
            + f"γ is in this config's units (Ku = {split.target_num_novel}); the trial ran with "
            f"{best['gamma_trial']:.4g} for {split.num_clusters} clusters.")


# -- command line ---------------------------------------------------------------------------------------------

class RefuseSearched(argparse.Action):
    """``--gamma``/``--alpha``/``--prior`` (and ``--labeler.gamma``, ...): remembered, then refused by :func:`main`
    — the search sets them, so a value given here would be silently overwritten."""

    def __call__(self, parser, namespace, values, option_string=None):
        namespace.searched = option_string


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python tuning/gamma_search.py", description=__doc__, allow_abbrev=False,
                                     usage="%(prog)s [--features URI] [--config YAML] [options] [--section.key V ...]",
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    data = parser.add_argument_group("data and base config")
    data.add_argument("--features", metavar="URI", default="",
                      help="feature table (parquet: embedding, label, split; local or s3://) or activation cache "
                           "(`ncdlr embed --trainable-blocks B --views A`). Absent → the embedded synthetic default. "
                           "For an image dataset run `ncdlr embed` first.")
    data.add_argument("--config", metavar="YAML", default="",
                      help="base config of the run you will train (configs/*.yaml); trials train its head on an "
                           "embedding table (encoder 'identity'), its last blocks and head on an activation cache; "
                           "best.yaml is this config with γ/α set")
    data.add_argument("--num-novel", metavar="KU", type=int, default=None,
                      help="Ku of the real problem (default: the table's metadata, e.g. from `ncdlr estimate-k`)")
    val = parser.add_argument_group("validation split (known classes only)")
    val.add_argument("--pseudo-novel-fraction", metavar="F", type=float, default=0.2,
                     help="share of known classes hidden as pseudo-novel, stratified over head/medium/tail (0.2)")
    val.add_argument("--holdout-fraction", metavar="F", type=float, default=0.2,
                     help="share of each class's images held out for scoring, never trained on (0.2)")
    val.add_argument("--val-seed", metavar="N", type=int, default=0,
                     help="seed of the pseudo-novel choice and the hold-out")
    val.add_argument("--problem", choices=("known", "planted"), default="known",
                     help="'known': the pseudo-novel classes alone, scored on their held-out images; 'planted': "
                          "planted among the table's novel rows (their labels never used), Ku' + Ku clusters, "
                          "scored by their F1 in the whole pool — the rehearsal of record for the cluster sizes "
                          "(--reg-m 0 0.45)")
    sp = parser.add_argument_group("search space and scheduler")
    sp.add_argument("--gamma-min", metavar="G", type=float, default=None,
                    help="lower end of log-uniform γ (default 50; embedded default 1). Small Ku needs small γ")
    sp.add_argument("--gamma-max", metavar="G", type=float, default=None,
                    help="upper end of γ (default 5000; embedded default 1000)")
    sp.add_argument("--alpha-min", metavar="A", type=float, default=0.25, help="lower end of uniform α (0.25)")
    sp.add_argument("--alpha-max", metavar="A", type=float, default=4.0, help="upper end of uniform α (4)")
    sp.add_argument("--no-uniform", action="store_true", help="leave out the uniform-prior (γ = ∞) candidate")
    sp.add_argument("--reg-m", metavar="R", type=float, nargs="+", default=None,
                    help="also search the cluster-size relaxation labeler.reg_m among these values, e.g. 0 0.45 "
                         "(0: sizes held at w, the paper's algorithm; > 0: relaxed); the uniform candidate is tried "
                         "with each (uniform prior + reg_m > 0 = the paper's relaxed OT solved exactly). Default: "
                         "the base config's reg_m, not searched")
    sp.add_argument("--gamma-transfer", choices=("ku", "none"), default="ku",
                    help="'ku': trials use γ·Ku'/Ku (same γ/Ku as the real run); 'none': trials use γ as is")
    sp.add_argument("--num-samples", metavar="N", type=int, default=8,
                    help="trials, the uniform candidate included (8)")
    sp.add_argument("--grace-period", metavar="EPOCHS", type=int, default=0,
                    help="ASHA: epochs before a trial may stop (0 → epochs/2: early validation scores are noisy)")
    sp.add_argument("--reduction-factor", metavar="R", type=float, default=2.0, help="ASHA reduction factor (2)")
    sp.add_argument("--search-seed", metavar="N", type=int, default=0, help="seed of the random search")
    res = parser.add_argument_group("resources and storage")
    res.add_argument("--workers-per-trial", metavar="N", type=int, default=1, help="Ray Train workers per trial (1); the run's whole step batch (data.batch_size × run.num_workers, "
                          "scaled by n'/n as the buffer) is split over them")
    res.add_argument("--cpus-per-trial", metavar="C", type=float, default=1.0,
                     help="CPUs per trial, split over its workers (1)")
    res.add_argument("--gpus-per-trial", metavar="G", type=float, default=0.0,
                     help="GPUs per trial; fractions share a GPU (0)")
    res.add_argument("--max-concurrent", metavar="N", type=int, default=0,
                     help="trials at once (0 → cluster CPUs / cpus-per-trial, at most 2 on the embedded default)")
    res.add_argument("--storage", metavar="URI", default="",
                     help="Tune/Train storage (local dir or s3://bucket/prefix; default <output>/ray). Rerunning with "
                          "the same --storage and --name resumes the search")
    res.add_argument("--name", default="gamma-search", help="experiment name (gamma-search)")
    res.add_argument("--output", metavar="DIR", default="runs/gamma-search",
                     help="local directory for trials.md/csv, best.yaml, gamma_scores.png, search.json")
    res.add_argument("--resume", action="store_true", help="require an existing experiment to resume (error if none)")
    res.add_argument("--verbose", action="store_true",
                     help="also show Ray's own output (worker logs, reports, checkpoints) and full tracebacks")
    for key in SEARCHED:
        parser.add_argument(f"--{key.split('.')[1]}", f"--{key}", action=RefuseSearched, dest="searched",
                            help=argparse.SUPPRESS)
    # model.num_novel: trials take the validation split's own Ku; the real run's Ku is this script's --num-novel
    add_override_arguments(parser, exclude=SEARCHED + ("model.num_novel",))
    return parser


# -- the flow of a search ---------------------------------------------------------------------------------------

def search(args: argparse.Namespace) -> int:
    """Validation table → Tune → ranked table, plot, best.yaml, search.json; 1 if unfinished or nothing scored."""
    start = time.perf_counter()
    space = search_space(args)
    output = Path(args.output).resolve()
    output.mkdir(parents=True, exist_ok=True)
    source, base = base_config(args, output)
    storage = ExperimentStorage.open(args.storage or str(output / "ray"), args.name)
    split = validation_split(args, source, storage)

    set_ray_env_defaults()
    started = init_ray(cpus_needed=args.cpus_per_trial + 1, verbose=base.run.verbose,
                       object_store_bytes=None if args.features else 256 * 1024**2)
    try:
        settings, grid = tune_search(args, base, split, storage, space, source)
        rows = rank_trials(trial_rows(grid, settings))
        unfinished = len(grid) - grid.num_terminated - grid.num_errors
    finally:
        if started:
            import ray

            ray.shutdown()

    write_table(rows, output, space, split.planted)
    if unfinished:
        print(f"{PROG}: the search stopped with {unfinished} of {len(rows)} trials unfinished; rerun the same command "
              f"to resume it (results so far are in {output})", file=sys.stderr)
    scored = [r for r in rows if r.get("score") is not None]
    if not scored:
        print(f"{PROG}: no trial reported a score (see the errors above)", file=sys.stderr)
        return 1
    best = scored[0]
    write_best_config(base, best, output / "best.yaml", best_note(args, best, rows, split, unfinished))
    seconds = time.perf_counter() - start
    (output / "search.json").write_text(json.dumps({
        "best": best, "trials": rows, "validation": asdict(split), "experiment": storage.uri, "seconds": seconds,
        "space": asdict(space)}, indent=2, default=str))
    prior = "uniform prior (γ = ∞)" if math.isinf(best["gamma"]) else f"γ = {best['gamma']:.4g}"
    print(f"[{PROG}] best: {prior}, α = {best['alpha']:.3g}, score {best['score']:.4f}; "
          f"wrote {output / 'best.yaml'} and {output / 'gamma_scores.png'} in {seconds:.0f} s", flush=True)
    print(output)
    return 1 if unfinished else 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.searched:
        print(f"{PROG}: {args.searched} is not accepted: the search chooses labeler.gamma, labeler.prior "
              f"(γ = ∞ is the uniform prior) and optim.alpha itself; set their ranges with --gamma-min/--gamma-max "
              f"and --alpha-min/--alpha-max", file=sys.stderr)
        return 2
    return run_main(PROG, lambda: search(args), verbose=args.verbose)


if __name__ == "__main__":
    sys.exit(main())
