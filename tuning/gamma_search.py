"""Ray Tune search for γ (cluster-size prior strength) and α (novel-loss weight) on a known-class validation split.

Usage:
  python tuning/gamma_search.py                       # embedded default: synthetic long-tailed features, 2 cores
  python tuning/gamma_search.py --features s3://bucket/features.parquet --config configs/openclipart.yaml \\
      --num-samples 32 --cpus-per-trial 4 --gpus-per-trial 0.5 --storage s3://bucket/tune --epochs 20

Validation protocol (never looks at novel labels):
  Only the `known` rows of the feature table are read. A seeded 20 % (--pseudo-novel-fraction) of the Ks known
  classes becomes pseudo-novel, chosen across head / medium / tail (3:4:3 by training count) so the long tail is
  kept; their labels are hidden during the trial (they form the unlabeled `novel` split). In every class a seeded
  20 % (--holdout-fraction) of the images is held out (split `val`) and never trained on. Trials train the real
  trainer on this table: the remaining known classes are labeled, pseudo-known labels 0..Ks'-1, pseudo-novel
  Ks'..Ks'+Ku'-1. Score = class-mean accuracy over the pseudo-novel classes of `val` after one Hungarian matching
  over all classes (ncdlr.metrics.cluster_accuracy "novel"); head/medium/tail of it are reported too. The
  validation table is written once to <storage>/<name>/validation.parquet.

Search space:
  γ log-uniform over [--gamma-min, --gamma-max] (default 50..5000, the paper's scale), plus the
  uniform-prior limit γ = ∞ (labeler.prior = uniform, α = 1) as an explicit first candidate; α uniform over
  [0.25, 4] (--alpha-min/--alpha-max).
  γ is searched in the units of the config you will train with (Ku novel classes). Because the labeler's
  objective divides the KL term by Ku, γ's pull grows as Ku shrinks (method.md §4 trap a); a trial on the
  pseudo-novel problem (Ku' classes) therefore runs with γ·Ku'/Ku, the same γ/Ku (turn off with
  --gamma-transfer none). For small Ku (tens of classes) the whole default range pins τ ≈ 1, i.e. behaves like
  the uniform prior — small Ku needs small γ: lower --gamma-min/--gamma-max (the embedded default searches
  1..1000 for its Ku = 20).
  ASHA (ray.tune.schedulers.ASHAScheduler, time attribute = epoch) stops poor trials early.

Each trial runs the real trainer: a Tune function trainable (tune.with_resources(..., {"CPU": 0.01})) builds a
Ray Train TorchTrainer with the trainer's worker function (ncdlr.service.trainer.train_worker) in feature-table
mode; a Train callback scores every epoch's checkpoint on `val` and forwards the metrics to Tune (the Ray 2.60
pattern: Tuner(TorchTrainer) is not supported under Train V2). Trials are resumable: rerunning the same command
(same --storage and --name) restores the Tune experiment (Tuner.restore) and each unfinished trial's
TorchTrainer resumes from its last checkpoint.

Outputs (in --output): trials.md / trials.csv (the ranked table, also printed), best.yaml (the best config —
the base config with labeler.gamma/labeler.prior/optim.alpha set; `ncdlr train --config best.yaml` and
`python -m ncdlr.train_inat2k --config best.yaml` accept it unchanged), gamma_scores.png (score vs γ, the
uniform limit as a separate marker) and search.json. Any config field (--epochs, --batch-size, --optim.lr, ...) can be
given to set the trials' base config.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import math
import os
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs

if __package__ in (None, ""):  # `python tuning/gamma_search.py`: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ncdlr.service.config import Config, ConfigError, from_dict, load_yaml, save_config  # noqa: E402

log = logging.getLogger("gamma_search")

UNIFORM = math.inf  #: the γ value that stands for the uniform-prior limit (labeler.prior = uniform)
EMBEDDED_GAMMA_RANGE = (1.0, 1000.0)  #: Ku = 20 in the embedded default: the paper's 50..5000 would pin τ ≈ 1


@dataclass(frozen=True)
class SearchSpace:
    """γ (config units, Ku novel classes) and α ranges; the uniform limit as an explicit candidate."""

    gamma_min: float = 50.0
    gamma_max: float = 5000.0
    alpha_min: float = 0.25
    alpha_max: float = 4.0
    include_uniform: bool = True

    def check(self) -> None:
        if not 0 < self.gamma_min < self.gamma_max < math.inf:
            raise ValueError(f"need 0 < --gamma-min < --gamma-max < inf, got {self.gamma_min}, {self.gamma_max}")
        if not 0 < self.alpha_min <= self.alpha_max:
            raise ValueError(f"need 0 < --alpha-min <= --alpha-max, got {self.alpha_min}, {self.alpha_max}")


def search_space(space: SearchSpace) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Tune ``param_space`` entries and the explicit ``points_to_evaluate`` (the uniform limit, α = 1)."""
    from ray import tune

    space.check()
    params = {"gamma": tune.loguniform(space.gamma_min, space.gamma_max),
              "alpha": tune.uniform(space.alpha_min, space.alpha_max)}
    points = [{"gamma": UNIFORM, "alpha": 1.0}] if space.include_uniform else []
    return params, points


def trial_gamma(gamma: float, val_num_novel: int, target_num_novel: int, transfer: bool) -> float:
    """γ for a trial on Ku' pseudo-novel classes that keeps γ/Ku of the target run (``transfer``), else γ."""
    if math.isinf(gamma) or not transfer:
        return gamma
    return gamma * val_num_novel / target_num_novel


def apply_trial_params(base: Config, gamma: float, alpha: float) -> Config:
    """``base`` with γ/α set: γ = ∞ → ``labeler.prior = uniform`` (γ left as in ``base``)."""
    cfg = from_dict(base.to_dict())
    if math.isinf(gamma):
        cfg.labeler.prior = "uniform"
    else:
        cfg.labeler.prior, cfg.labeler.gamma = "adaptive", float(gamma)
    cfg.optim.alpha = float(alpha)
    return cfg


# -- the trial: a Tune function that runs the trainer's TorchTrainer ------------------------------------------

def score_predictions(y_true, y_pred, num_known: int, train_counts) -> dict[str, float]:
    """Validation metrics: ``score`` = pseudo-novel class-mean accuracy, its head/medium/tail, all/known."""
    from ncdlr.metrics import cluster_accuracy

    acc = cluster_accuracy(y_true, y_pred, num_known, train_counts)
    return {"score": acc["novel"], "score_head": acc["novel_head"], "score_medium": acc["novel_medium"],
            "score_tail": acc["novel_tail"], "val_all": acc["all"], "val_known": acc["known"],
            "val_novel_inst": acc["novel_inst"]}


def _validation_callback_class():
    """Defined lazily so importing this module does not import Ray Tune."""
    from ray.tune.integration.ray_train import CHECKPOINT_PATH_KEY, TuneReportCallback

    class ValidationScoreCallback(TuneReportCallback):
        """Train → Tune bridge that scores each reported checkpoint on the validation table's ``val`` split.

        Runs on the Ray Train controller: after every epoch report (rank 0 checkpoints each epoch) it loads
        the checkpoint's model, predicts ``val`` and forwards ``{train metrics, score, ...}`` to the trial.
        """

        def __init__(self, cfg: dict, env: dict[str, str]):
            super().__init__()
            self._cfg, self._env = cfg, env
            self._val = None

        def __setstate__(self, state: dict) -> None:
            # Unpickled in the controller process: give it the driver's S3 settings before any storage access.
            self.__dict__.update(state)
            os.environ.update(self._env)

        def _val_data(self):
            if self._val is None:
                from ncdlr.service.embed import read_feature_table
                from ncdlr.service.validation import SCORING_SPLIT

                splits = read_feature_table(self._cfg["data"]["features"])
                self._val = (splits.features[SCORING_SPLIT], splits.labels[SCORING_SPLIT].numpy(),
                             splits.num_known, splits.num_novel, splits.train_counts())
            return self._val

        def after_report(self, run_context, metrics, checkpoint):
            import torch

            from ncdlr.service.evaluate import load_trained_model
            from ncdlr.service.train_loop import predict

            row = dict(metrics[0])
            if checkpoint is not None:
                x, y, ks, ku, counts = self._val_data()
                cfg = from_dict(self._cfg)
                with checkpoint.as_directory() as directory:
                    model, _ = load_trained_model(cfg, directory, ks, ku)
                y_pred = predict(model, list(x.split(cfg.data.eval_batch_size)), torch.device("cpu"))
                row.update(score_predictions(y, y_pred, ks, counts))
                row[CHECKPOINT_PATH_KEY] = checkpoint.path
            self._training_actor_item_queue.put(row)

    return ValidationScoreCallback


def _train_worker_in_trial(config: dict) -> None:
    """The trainer's worker function, after rank 0 registers the worker group's placement group (see
    :func:`release_stopped_trial_groups`)."""
    import ray
    import ray.train

    from ncdlr.service.trainer import train_worker

    group = ray.util.get_current_placement_group()
    if group is not None and ray.train.get_context().get_world_rank() == 0:
        registry = ray.get_actor(config["pg_registry"], namespace="ncdlr")
        ray.get(registry.add.remote(config["trial_id"], group.id.hex()))
    train_worker(config)


def placement_group_registry(name: str):
    """A named actor mapping trial id → the placement groups its TorchTrainer created (created if absent)."""
    import ray

    @ray.remote(num_cpus=0)
    class PlacementGroupRegistry:
        def __init__(self):
            self.groups: dict[str, set[str]] = {}

        def add(self, trial_id: str, group: str) -> None:
            self.groups.setdefault(trial_id, set()).add(group)

        def pop(self, trial_id: str) -> list[str]:
            return sorted(self.groups.pop(trial_id, set()))

    return PlacementGroupRegistry.options(name=name, namespace="ncdlr", get_if_exists=True).remote()


def release_stopped_trial_groups(registry_name: str):
    """A Tune callback that removes the placement group of every trial that ends.

    Ray Train V2 creates its worker group's placement group from the controller actor, and a placement group
    lives as long as the job that created it, not the actor. When ASHA (or an interruption) stops a trial,
    Tune ends the trial actor, the controller dies with it and never removes the group: its CPUs stay
    reserved and later trials wait for them forever. A trial that finishes normally has already removed it.
    """
    from ray import tune

    class ReleaseStoppedTrialGroups(tune.Callback):
        def _release(self, trial) -> None:
            import ray
            from ray._raylet import PlacementGroupID
            from ray.util.placement_group import PlacementGroup, placement_group_table, remove_placement_group

            registry = placement_group_registry(registry_name)
            table = placement_group_table()
            for group in ray.get(registry.pop.remote(trial.trial_id)):
                if table.get(group, {}).get("state") not in (None, "REMOVED"):
                    remove_placement_group(PlacementGroup(PlacementGroupID(bytes.fromhex(group))))
                    log.info("released the placement group %s of stopped trial %s", group, trial.trial_id)

        def on_trial_complete(self, iteration, trials, trial, **info):
            self._release(trial)

        def on_trial_error(self, iteration, trials, trial, **info):
            self._release(trial)

    return ReleaseStoppedTrialGroups()


def run_trial(config: dict, settings: dict, env: dict[str, str] | None = None) -> None:
    """Tune function trainable: one (γ, α) trained with the real trainer on the validation table.

    ``config``: ``gamma``, ``alpha`` (the searched values). ``settings`` (the same for every trial, stored
    with the experiment as ``search_settings.json``): ``cfg`` (base Config dict, data.features = the
    validation table), ``target_num_novel``, ``val_num_novel``, ``gamma_transfer``, ``workers``,
    ``cpus_per_trial``, ``gpus_per_trial``, ``train_storage`` (where each trial's TorchTrainer keeps its
    checkpoints). ``env``: the driver's ``AWS_*`` variables; trial, Train controller and workers apply them.
    ``settings`` and ``env`` come through ``tune.with_parameters``, so credentials stay out of stored configs.
    """
    import ray
    import ray.tune
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig

    from ncdlr.service.trainer import run_torch_trainer, summarize_data

    os.environ.update(env or {})
    gamma_run = trial_gamma(config["gamma"], settings["val_num_novel"], settings["target_num_novel"],
                            settings["gamma_transfer"])
    cfg = apply_trial_params(from_dict(settings["cfg"]), gamma_run, config["alpha"])
    context = ray.tune.get_context()
    trial_id = context.get_trial_id()
    cfg.run.output = os.path.join(context.get_trial_dir(), "run")
    cfg.run.evaluate = False
    workers = int(settings["workers"])
    use_gpu = settings["gpus_per_trial"] > 0
    cfg.run.num_workers, cfg.run.cpus_per_worker = workers, settings["cpus_per_trial"] / workers
    cfg.run.use_gpu = "true" if use_gpu else "false"
    summary = summarize_data(cfg)
    cfg.model.feature_dim = summary.feature_dim
    Path(cfg.run.output).mkdir(parents=True, exist_ok=True)
    save_config(cfg, Path(cfg.run.output) / "config.yaml")

    resources = {"CPU": cfg.run.cpus_per_worker, **({"GPU": settings["gpus_per_trial"] / workers} if use_gpu else {})}
    storage_fs, storage_path = ray_storage(settings["train_storage"])
    run_torch_trainer(
        cfg, summary, _train_worker_in_trial,
        actor_name=f"buffer-tune-{trial_id}-{uuid.uuid4().hex[:6]}",
        num_novel=summary.num_novel,
        extra_loop_config={"trial_id": trial_id, "pg_registry": settings["pg_registry"]},
        scaling_config=ScalingConfig(num_workers=workers, use_gpu=use_gpu, resources_per_worker=resources),
        # A fixed name per trial: a restored trial's TorchTrainer resumes from its own last checkpoint.
        run_config=RunConfig(name=f"trial-{trial_id}", storage_path=storage_path, storage_filesystem=storage_fs,
                             checkpoint_config=CheckpointConfig(num_to_keep=1),
                             failure_config=FailureConfig(max_failures=cfg.run.max_failures),
                             callbacks=[_validation_callback_class()(cfg.to_dict(), env or {})]),
    )


# -- storage: Ray Tune/Train on s3:// ---------------------------------------------------------------------------

def ray_storage(uri: str):
    """``(filesystem, path)`` for Ray's ``storage_filesystem``/``storage_path``: local → ``(None, abs path)``;
    ``s3://bucket/prefix`` → the marker-free S3 filesystem of :func:`ncdlr.data.storage.run_storage_filesystem`."""
    from ncdlr.data.storage import is_s3, run_storage_filesystem

    if not is_s3(uri):
        return None, str(Path(uri).resolve())
    return run_storage_filesystem(uri)  # checks the bucket; errors name the URI


# -- the data: a feature table, or the embedded synthetic default ----------------------------------------------

def embedded_default(out_dir: Path, seed: int = 0) -> tuple[str, Config]:
    """Write the embedded default's feature table and return it with its base config.

    The table is the synthetic long-tailed problem of :mod:`ncdlr.experiments.synthetic` (Ks = Ku = 20
    classes, 600 → 12 images per class, signal hidden under larger nuisance dimensions, so the head must
    learn from labels); the base config trains an MLP head on it for 8 epochs.
    """
    import numpy as np

    from ncdlr.experiments.synthetic import Setting, make_data
    from ncdlr.service.embed import write_feature_table

    setting = Setting(n_max=600)  # ≈ 480 pseudo-novel training rows: ≈ 15 steps of 32 per epoch
    path = out_dir / "data" / f"synthetic-features-seed{seed}.parquet"
    if not path.is_file():
        known, novel, test, _ = make_data(setting, seed)
        parts = ((known, "known"), (novel, "novel"), (test, "test"))
        x = np.concatenate([p.x.numpy() for p, _ in parts])
        y = np.concatenate([p.y.numpy() for p, _ in parts])
        splits = sum(([name] * len(p.y) for p, name in parts), [])
        write_feature_table(str(path), x, y, splits, num_known=setting.num_known, num_novel=setting.num_novel,
                            extra={"dataset": "ncdlr.experiments.synthetic", "seed": seed})
    cfg = Config()
    cfg.data.features = str(path)
    cfg.data.batch_size, cfg.data.feature_noise = 32, setting.view_noise
    cfg.model.encoder, cfg.model.head = "identity", "mlp"
    cfg.labeler.buffer_size = 512
    cfg.optim.epochs, cfg.optim.lr, cfg.optim.min_lr, cfg.optim.warmup_epochs = 8, 1e-2, 1e-3, 1.0
    cfg.run.log_every = 0
    return str(path), cfg


def feature_mode(cfg: Config) -> Config:
    """A copy of ``cfg`` that trains on embeddings: encoder ``identity``; a trainable head (keep linear/mlp)."""
    out = from_dict(cfg.to_dict())
    out.model.encoder, out.model.pretrained, out.model.trainable_blocks = "identity", "", 0
    if out.model.head not in ("linear", "mlp"):
        out.model.head = "mlp"
    return out


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


def _fmt(value, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


COLUMNS = ("rank", "trial", "gamma", "gamma_trial", "alpha", "epoch", "score", "score_head", "score_medium",
           "score_tail", "val_all", "tau", "status")


def format_table(rows: list[dict]) -> str:
    """The ranked trials as a Markdown table (γ = ∞ is the uniform-prior limit)."""
    head = ("rank", "trial", "γ", "γ (trial)", "α", "epochs", "score (pseudo-novel)", "H", "M", "T", "val all", "τ",
            "status")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = []
        for col in COLUMNS:
            value = row.get(col)
            if col in ("gamma", "gamma_trial") and value is not None and math.isinf(value):
                cells.append("∞ (uniform)")
            elif col in ("gamma", "gamma_trial") and value is not None:
                cells.append(f"{value:.4g}")
            elif col == "epoch":
                cells.append(str(int(value)) if value is not None else "-")
            else:
                cells.append(_fmt(value))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_scores(rows: list[dict], path: Path, space: SearchSpace) -> None:
    """Score vs γ (log x) for the finite γ; the uniform limit as a separate star marker right of the range."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    finite = [r for r in rows if r.get("score") is not None and not math.isinf(r["gamma"])]
    uniform = [r for r in rows if r.get("score") is not None and math.isinf(r["gamma"])]
    if finite:
        points = ax.scatter([r["gamma"] for r in finite], [r["score"] for r in finite],
                            c=[r["alpha"] for r in finite], cmap="viridis", s=[18 + 6 * (r.get("epoch") or 0) for r in finite])
        fig.colorbar(points, ax=ax, label="α")
    x_uniform = space.gamma_max * 3
    for r in uniform:
        ax.scatter([x_uniform], [r["score"]], marker="*", s=220, color="crimson", label="uniform prior (γ = ∞)")
    ax.set_xscale("log")
    ax.set_xlim(space.gamma_min / 1.5, x_uniform * 1.8)
    ax.set_xlabel("γ (config units; marker size = epochs trained)")
    ax.set_ylabel("pseudo-novel class-mean accuracy")
    ax.set_title("γ/α search on the known-class validation split")
    if uniform:
        ax.legend(loc="best")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_best_config(base: Config, best: dict, path: Path, note: str) -> Config:
    """Write ``base`` with the best γ/α as YAML, re-load it with the trainer's loader and return it."""
    cfg = apply_trial_params(base, best["gamma"], best["alpha"])
    save_config(cfg, path)
    header = "".join(f"# {line}\n" for line in note.splitlines())
    path.write_text(header + path.read_text())
    return load_yaml(path)  # the trainer's own loader: raises ConfigError if the file would be refused


def collect_rows(result_grid, settings: dict) -> list[dict]:
    """One row per trial from a Tune ResultGrid (last reported metrics)."""
    rows = []
    target_num_novel, val_num_novel = settings["target_num_novel"], settings["val_num_novel"]
    transfer, epochs = settings["gamma_transfer"], settings["cfg"]["optim"]["epochs"]
    for result in result_grid:
        metrics = result.metrics or {}
        gamma, alpha = result.config["gamma"], result.config["alpha"]
        if result.error:
            status = "error"
        elif metrics.get("epoch") is None:
            status = "not run"
        else:  # fewer epochs: stopped by ASHA (or by an interruption, until the search is resumed)
            status = "completed" if metrics["epoch"] == epochs else "stopped"
        rows.append({
            "trial": metrics.get("trial_id") or Path(result.path).name,
            "gamma": float(gamma), "gamma_trial": trial_gamma(float(gamma), val_num_novel, target_num_novel, transfer),
            "alpha": float(alpha), "status": status,
            **{k: metrics.get(k) for k in ("epoch", "score", "score_head", "score_medium", "score_tail", "val_all",
                                           "val_known", "tau", "loss")},
        })
    return rows


# -- command line ---------------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    from ncdlr.service.config import add_override_arguments

    parser = argparse.ArgumentParser(prog="python tuning/gamma_search.py", description=__doc__, allow_abbrev=False,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    data = parser.add_argument_group("data and base config")
    data.add_argument("--features", metavar="URI", default="",
                      help="feature table (parquet: embedding, label, split; local or s3://). Absent → the embedded "
                           "synthetic default. For an image dataset run `ncdlr embed` first.")
    data.add_argument("--config", metavar="YAML", default="",
                      help="base config of the run you will train (configs/*.yaml); trials train its head on the "
                           "features (encoder 'identity'); best.yaml is this config with γ/α set")
    data.add_argument("--num-novel", type=int, default=None,
                      help="Ku of the real problem (default: the table's metadata, e.g. from `ncdlr estimate-k`)")
    val = parser.add_argument_group("validation split (known classes only)")
    val.add_argument("--pseudo-novel-fraction", type=float, default=0.2,
                     help="share of known classes hidden as pseudo-novel, stratified over head/medium/tail (0.2)")
    val.add_argument("--holdout-fraction", type=float, default=0.2,
                     help="share of each class's images held out for scoring, never trained on (0.2)")
    val.add_argument("--val-seed", type=int, default=0, help="seed of the pseudo-novel choice and the hold-out")
    sp = parser.add_argument_group("search space and scheduler")
    sp.add_argument("--gamma-min", type=float, default=None,
                    help="lower end of log-uniform γ (default 50; embedded default 1). Small Ku needs small γ")
    sp.add_argument("--gamma-max", type=float, default=None, help="upper end of γ (default 5000; embedded default 1000)")
    sp.add_argument("--alpha-min", type=float, default=0.25, help="lower end of uniform α (0.25)")
    sp.add_argument("--alpha-max", type=float, default=4.0, help="upper end of uniform α (4)")
    sp.add_argument("--no-uniform", action="store_true", help="leave out the uniform-prior (γ = ∞) candidate")
    sp.add_argument("--gamma-transfer", choices=("ku", "none"), default="ku",
                    help="'ku': trials use γ·Ku'/Ku (same γ/Ku as the real run); 'none': trials use γ as is")
    sp.add_argument("--num-samples", type=int, default=8, help="trials, the uniform candidate included (8)")
    sp.add_argument("--grace-period", type=int, default=0,
                    help="ASHA: epochs before a trial may stop (0 → epochs/2: early validation scores are noisy)")
    sp.add_argument("--reduction-factor", type=float, default=2.0, help="ASHA reduction factor (2)")
    sp.add_argument("--search-seed", type=int, default=0, help="seed of the random search")
    res = parser.add_argument_group("resources and storage")
    res.add_argument("--workers-per-trial", type=int, default=1, help="Ray Train workers per trial (1)")
    res.add_argument("--cpus-per-trial", type=float, default=1.0, help="CPUs per trial, split over its workers (1)")
    res.add_argument("--gpus-per-trial", type=float, default=0.0, help="GPUs per trial; fractions share a GPU (0)")
    res.add_argument("--max-concurrent", type=int, default=0,
                     help="trials at once (0 → cluster CPUs / cpus-per-trial, at most 2 on the embedded default)")
    res.add_argument("--storage", metavar="URI", default="",
                     help="Tune/Train storage (local dir or s3://bucket/prefix; default <output>/ray). Rerunning with "
                          "the same --storage and --name resumes the search")
    res.add_argument("--name", default="gamma-search", help="experiment name (gamma-search)")
    res.add_argument("--output", metavar="DIR", default="runs/gamma-search",
                     help="local directory for trials.md/csv, best.yaml, gamma_scores.png, search.json")
    res.add_argument("--resume", action="store_true", help="require an existing experiment to resume (error if none)")
    add_override_arguments(parser)
    return parser


def _ensure_ray(embedded: bool) -> None:
    import ray

    if ray.is_initialized():
        return
    if os.environ.get("RAY_ADDRESS") or not embedded:
        ray.init(address=os.environ.get("RAY_ADDRESS") or None, log_to_driver=False)
    else:
        ray.init(num_cpus=max(4, os.cpu_count() or 1), object_store_memory=256 * 1024**2, include_dashboard=False,
                 log_to_driver=False)


def _write_text(uri: str, text: str) -> None:
    from ncdlr.data.storage import is_s3, resolve

    if not is_s3(uri):
        Path(uri).parent.mkdir(parents=True, exist_ok=True)
        Path(uri).write_text(text)
        return
    fs, path = resolve(uri)
    with fs.open_output_stream(path) as stream:
        stream.write(text.encode())


def _read_text(uri: str) -> str:
    from ncdlr.data.storage import resolve

    fs, path = resolve(uri)
    with fs.open_input_stream(path) as stream:
        return stream.read().decode()


def _table_exists(uri: str) -> bool:
    from ncdlr.data.storage import resolve

    fs, path = resolve(uri)
    return fs.get_file_info(path).type == pafs.FileType.File


def main(argv: list[str] | None = None) -> int:
    from ncdlr.service.config import apply_overrides, load_config, overrides_from_args

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    # Before ray.init, so Ray's processes inherit them: fast report polling; and a worker-group start timeout
    # well above Ray's 60 s, which a loaded small machine exceeds (the controller then retries forever).
    for key, value in {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.1", "RAY_DATA_DISABLE_PROGRESS_BARS": "1",
                       "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "900"}.items():
        os.environ.setdefault(key, value)
    args = build_parser().parse_args(argv)
    start = time.perf_counter()
    output = Path(args.output).resolve()
    output.mkdir(parents=True, exist_ok=True)
    embedded = not args.features

    gmin, gmax = EMBEDDED_GAMMA_RANGE if embedded else (50.0, 5000.0)
    space = SearchSpace(args.gamma_min if args.gamma_min is not None else gmin,
                        args.gamma_max if args.gamma_max is not None else gmax,
                        args.alpha_min, args.alpha_max, not args.no_uniform)
    try:
        space.check()
    except ValueError as err:
        print(f"gamma_search: {err}", file=sys.stderr)
        return 2

    # ---- data and base config ---------------------------------------------------------------------------------
    try:
        if embedded:
            source, base = embedded_default(output, args.val_seed)
            if args.config:
                base = load_config(args.config)
                base.data.features = source
            print(f"[gamma_search] embedded default: synthetic long-tailed feature table {source}", flush=True)
        else:
            source = args.features
            base = load_config(args.config) if args.config else Config()
            if not args.config:
                base.model.encoder, base.model.head = "identity", "mlp"
            base.data.features = source
        base = apply_overrides(base, overrides_from_args(args))
    except ConfigError as err:
        print(f"gamma_search: {err}", file=sys.stderr)
        return 2
    from ncdlr.data.storage import StorageError, is_s3, join

    storage = args.storage or str(output / "ray")
    try:
        storage_fs, storage_root = ray_storage(storage)
    except StorageError as err:
        print(f"gamma_search: --storage: {err}", file=sys.stderr)
        return 2
    experiment = join(storage, args.name) if is_s3(storage) else str(Path(storage_root, args.name))
    experiment_path = f"{storage_root}/{args.name}"  # inside storage_fs
    table_uri = join(experiment, "validation.parquet") if is_s3(storage) else str(Path(experiment, "validation.parquet"))

    # ---- validation table (once per experiment) ---------------------------------------------------------------
    from ncdlr.service.validation import ValidationConfig, build_validation_table, read_validation_split

    if _table_exists(table_uri):
        split = read_validation_split(table_uri)
        print(f"[gamma_search] reusing validation table {table_uri}", flush=True)
    else:
        try:
            split = build_validation_table(source, table_uri, ValidationConfig(args.pseudo_novel_fraction,
                                                                               args.holdout_fraction, args.val_seed),
                                           num_novel=args.num_novel)
        except (ValueError, FileNotFoundError) as err:
            print(f"gamma_search: {err}", file=sys.stderr)
            return 2
    print(f"[gamma_search] validation split of the {split.target_num_known} known classes: "
          f"{split.num_known} pseudo-known, {split.num_novel} pseudo-novel {split.pseudo_novel}; "
          f"rows {split.split_counts}; target Ku = {split.target_num_novel}", flush=True)

    # ---- Tune ------------------------------------------------------------------------------------------------
    import ray
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search.basic_variant import BasicVariantGenerator

    if __package__ not in (None, ""):  # imported (tests, other drivers): ship this module's code by value
        import cloudpickle

        cloudpickle.register_pickle_by_value(sys.modules[__name__])
    _ensure_ray(embedded)
    trial_base = feature_mode(base)
    trial_base.data.features = table_uri
    params, points = search_space(space)
    settings_uri = join(experiment, "search_settings.json") if is_s3(storage) else str(Path(experiment, "search_settings.json"))
    resuming = tune.Tuner.can_restore(experiment_path, storage_filesystem=storage_fs)
    if resuming:
        settings = json.loads(_read_text(settings_uri))
    else:
        settings = {"cfg": trial_base.to_dict(), "target_num_novel": split.target_num_novel,
                    "val_num_novel": split.num_novel, "gamma_transfer": args.gamma_transfer == "ku",
                    "workers": args.workers_per_trial, "cpus_per_trial": args.cpus_per_trial,
                    "gpus_per_trial": args.gpus_per_trial,
                    "train_storage": join(experiment, "train") if is_s3(storage) else str(Path(experiment, "train")),
                    "pg_registry": f"gamma-search-groups-{uuid.uuid4().hex[:8]}"}
        _write_text(settings_uri, json.dumps(settings, indent=2))
    epochs = settings["cfg"]["optim"]["epochs"]
    concurrent = args.max_concurrent or max(1, int(ray.cluster_resources().get("CPU", 1) // max(args.cpus_per_trial, 0.01)))
    if embedded and not args.max_concurrent:
        concurrent = min(concurrent, 2)
    aws_env = {k: v for k, v in os.environ.items() if k.startswith("AWS_")}
    registry = placement_group_registry(settings["pg_registry"])  # held until the search returns
    trainable = tune.with_resources(tune.with_parameters(run_trial, settings=settings, env=aws_env), {"CPU": 0.01})
    if resuming:
        print(f"[gamma_search] resuming the experiment at {experiment} (its search space and settings are kept)",
              flush=True)
        tuner = tune.Tuner.restore(experiment_path, trainable, resume_unfinished=True, resume_errored=True,
                                   storage_filesystem=storage_fs)
    elif args.resume:
        print(f"gamma_search: --resume given but there is no experiment to resume at {experiment}", file=sys.stderr)
        return 2
    else:
        scheduler = ASHAScheduler(time_attr="epoch", max_t=epochs, grace_period=args.grace_period or max(1, epochs // 2),
                                  reduction_factor=args.reduction_factor)
        tuner = tune.Tuner(
            trainable, param_space=params,
            tune_config=tune.TuneConfig(metric="score", mode="max", scheduler=scheduler, num_samples=args.num_samples,
                                        # max_concurrent_trials is ignored with a BasicVariantGenerator: set it here
                                        search_alg=BasicVariantGenerator(points_to_evaluate=points,
                                                                         max_concurrent=concurrent,
                                                                         random_state=args.search_seed)),
            run_config=tune.RunConfig(name=args.name, storage_path=storage_root, storage_filesystem=storage_fs, verbose=1,
                                      callbacks=[release_stopped_trial_groups(settings["pg_registry"])]),
        )
    print(f"[gamma_search] {args.num_samples} trials, {concurrent} at a time, {epochs} epochs each (ASHA), "
          f"γ ∈ [{space.gamma_min:g}, {space.gamma_max:g}]" + (" + uniform" if space.include_uniform else "")
          + f", α ∈ [{space.alpha_min:g}, {space.alpha_max:g}], storage {storage}", flush=True)
    grid = tuner.fit()
    del registry

    # ---- results -------------------------------------------------------------------------------------------------
    rows = rank_trials(collect_rows(grid, settings))
    scored = [r for r in rows if r.get("score") is not None]
    table = format_table(rows)
    print(table)
    (output / "trials.md").write_text(table + "\n")
    with open(output / "trials.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(COLUMNS) + ["val_known", "loss"], extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    plot_scores(rows, output / "gamma_scores.png", space)
    unfinished = len(grid) - grid.num_terminated - grid.num_errors
    if unfinished:
        print(f"gamma_search: the search stopped with {unfinished} of {len(grid)} trials unfinished; rerun the "
              f"same command to resume it (results so far are in {output})", file=sys.stderr)
    if not scored:
        print("gamma_search: no trial reported a score (see the errors above)", file=sys.stderr)
        return 1
    best = scored[0]
    prior = "uniform prior (γ = ∞)" if math.isinf(best["gamma"]) else f"γ = {best['gamma']:.4g}"
    note = (f"Best of {len(rows)} trials{' (search unfinished)' if unfinished else ''} of tuning/gamma_search.py "
            f"({args.name}): {prior}, α = {best['alpha']:.3g};\n"
            f"pseudo-novel class-mean accuracy {best['score']:.4f} on the known-class validation split\n"
            f"({split.num_known} pseudo-known / {split.num_novel} pseudo-novel classes of {source}).\n"
            f"γ is in this config's units (Ku = {split.target_num_novel}); the trial ran with "
            f"{best['gamma_trial']:.4g} for Ku' = {split.num_novel}.")
    write_best_config(base, best, output / "best.yaml", note)
    seconds = time.perf_counter() - start
    (output / "search.json").write_text(json.dumps({
        "best": best, "trials": rows, "validation": split.__dict__, "experiment": experiment, "seconds": seconds,
        "space": space.__dict__}, indent=2, default=str))
    print(f"[gamma_search] best: {prior}, α = {best['alpha']:.3g}, score {best['score']:.4f}; "
          f"wrote {output / 'best.yaml'} and {output / 'gamma_scores.png'} in {seconds:.0f} s", flush=True)
    print(output)
    return 1 if unfinished else 0


if __name__ == "__main__":
    sys.exit(main())
