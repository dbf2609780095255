"""Ray Tune glue of the γ/α search (``tuning/gamma_search.py``): trials that run the real trainer.

A trial is a Tune *function* trainable (:func:`run_trial`, wrapped by :func:`trainable` with
``{"CPU": 0.01}``) that builds a Ray Train ``TorchTrainer`` around :func:`ncdlr.service.worker.train_worker`
in feature-table mode, on the known-class validation table of :mod:`ncdlr.service.validation`. Ray 2.60
(Train V2) needs three workarounds, all kept here:

* ``Tuner(TorchTrainer)`` fails under Train V2 ("Improper 'run'"), hence the function trainable; a Train
  callback (:class:`ValidationScoreCallback`) scores each epoch's checkpoint (:class:`ScoringRows`) and hands the
  metrics to the trial, whose own thread reports them to Tune (:func:`fit_reporting_to_tune`). Ray's
  ``TuneReportCallback`` is not used: it feeds the trial actor's main thread, and when ``fit()`` returns
  before Tune asks for the last epoch (a busy driver) the function's end-of-trial report fills Tune's
  one-slot result queue first and the main thread blocks forever putting the last epoch behind it: the
  trial stays RUNNING and the search never ends.
* Train V2's controller creates the worker group's placement group, and a placement group lives as long as
  the *job*: when ASHA stops a trial the group stays reserved and later trials wait forever. The worker
  registers its group (:func:`placement_group_registry`) and :class:`ReleaseStoppedTrialGroups` removes it.
* Ray gives a worker group 60 s to start, too little on a loaded small machine (:data:`RAY_ENV_DEFAULTS`).

Searches are resumable: :class:`ExperimentStorage` (local or ``s3://``) holds the Tune experiment, the
validation table, the :class:`TrialSettings` and each trial's TorchTrainer run under fixed names, so
:func:`restore_tuner` continues a stopped search and each trial its TorchTrainer from its last checkpoint.

γ is searched in the units of the real run (Ku novel classes); a trial on Ku' pseudo-novel classes runs with
``γ·Ku'/Ku`` (:func:`trial_gamma`: the labeler divides the KL term by Ku, so γ/Ku is what transfers).
γ = ∞ (:data:`UNIFORM`) stands for the uniform-prior limit, ``labeler.prior = uniform``.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import os
import threading
import uuid
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.fs as pafs
import ray
import ray.train
import torch
from ray import tune
from ray.train import UserCallback
from ray.tune.integration.ray_train import CHECKPOINT_PATH_KEY
from ray.util.queue import Empty, Queue

from ncdlr.data.features import FeatureSplits, first_view
from ncdlr.data.storage import is_s3, join
from ncdlr.method_settings import GAMMA_UNIFORM

from .config import Config, ConfigError, from_dict, save_config
from .rehearsal import scaled_config, single_process
from .trainer import ray_storage
from .validation import SCORING_SPLIT, ValidationSplit, planted_scores, validation_scores

log = logging.getLogger(__name__)

UNIFORM = GAMMA_UNIFORM  #: the γ that stands for the uniform-prior limit (labeler.prior = uniform)
#: Set before Ray starts, so its processes inherit them: report polling without the 1.8 s wait, no progress
#: bars, and a worker-group start timeout well above Ray's 60 s (past it the controller retries forever).
RAY_ENV_DEFAULTS = {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.1", "RAY_DATA_DISABLE_PROGRESS_BARS": "1",
                    "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "900"}


def set_ray_env_defaults() -> None:
    """Apply :data:`RAY_ENV_DEFAULTS` where the environment does not set them (call before ``init_ray``)."""
    for key, value in RAY_ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)


# -- what a trial runs ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SearchSpace:
    """γ (config units, Ku novel classes) log-uniform, α uniform; the uniform limit as an explicit candidate.

    ``reg_m``: when given, the cluster-size relaxation ``labeler.reg_m`` is searched too, a choice among these values
    (e.g. ``(0, 0.45)``: sizes held or relaxed), and the uniform limit is evaluated with each of them (the uniform
    prior with ``reg_m > 0`` is the paper's relaxed OT solved exactly). Empty: the base config's ``reg_m``."""

    gamma_min: float = 50.0
    gamma_max: float = 5000.0
    alpha_min: float = 0.25
    alpha_max: float = 4.0
    include_uniform: bool = True
    reg_m: tuple[float, ...] = ()

    def check(self) -> None:
        if not 0 < self.gamma_min < self.gamma_max < math.inf:
            raise ConfigError(f"need 0 < --gamma-min < --gamma-max < inf, got {self.gamma_min:g}, {self.gamma_max:g}")
        if not 0 < self.alpha_min <= self.alpha_max:
            raise ConfigError(f"need 0 < --alpha-min <= --alpha-max, got {self.alpha_min:g}, {self.alpha_max:g}")
        if any(not 0 <= r < math.inf for r in self.reg_m):
            raise ConfigError(f"--reg-m values must be finite and >= 0, got {' '.join(f'{r:g}' for r in self.reg_m)}")

    def tune_space(self) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """Tune's ``param_space`` and ``points_to_evaluate`` (the uniform limit with α = 1, evaluated first; with
        :attr:`reg_m`, once per value)."""
        self.check()
        params = {"gamma": tune.loguniform(self.gamma_min, self.gamma_max),
                  "alpha": tune.uniform(self.alpha_min, self.alpha_max)}
        if self.reg_m:
            params["reg_m"] = tune.choice(list(self.reg_m))
        if not self.include_uniform:
            return params, []
        uniform = {"gamma": UNIFORM, "alpha": 1.0}
        return params, [{**uniform, "reg_m": r} for r in self.reg_m] if self.reg_m else [uniform]


def trial_gamma(gamma: float, val_num_novel: int, target_num_novel: int, transfer: bool) -> float:
    """γ for a trial on Ku' pseudo-novel classes that keeps γ/Ku of the target run (``transfer``), else γ."""
    if math.isinf(gamma) or not transfer:
        return gamma
    return gamma * val_num_novel / target_num_novel


def apply_trial_params(base: Config, gamma: float, alpha: float, reg_m: float | None = None) -> Config:
    """A copy of ``base`` with γ/α set: γ = ∞ → ``labeler.prior = uniform`` (γ left as in ``base``); ``reg_m``, when
    given, sets ``labeler.reg_m``."""
    cfg = copy.deepcopy(base)
    if not math.isinf(gamma):
        cfg.labeler.prior = "adaptive"
    cfg.labeler.set_gamma(gamma)
    cfg.optim.alpha = float(alpha)
    if reg_m is not None:
        cfg.labeler.reg_m = float(reg_m)
    return cfg


def trial_base(cfg: Config, novel_rows: int, real_novel_rows: int, workers: int) -> Config:
    """The trials' base config: the real run's step, scaled to the validation problem as the in-process rehearsal
    scales it (:func:`ncdlr.service.rehearsal.trial_config`), on ``workers`` trial workers.

    ``data.batch_size`` is per worker, so the real run's whole step takes ``data.batch_size × run.num_workers``
    rows per half (configs/openclipart.yaml: 32 × 2 = 64). That batch and ``labeler.buffer_size`` are scaled by
    n'/n, the validation problem's ``novel_rows`` over the real table's ``real_novel_rows`` (at most 1; 1 when the
    real table has no novel rows, and on the planted problem, whose pool holds every real novel row), so a trial's
    epoch has as many steps as a real one and its buffer the same share of an epoch. The scaled batch is then
    split over the ``workers`` trial workers (at least one row each): before this, a trial took the real run's
    per-worker batch on ``--workers-per-trial`` (1) workers, half the real step for a two-worker config, unscaled."""
    if workers < 1:
        raise ConfigError(f"a trial needs at least one worker, got {workers}")
    scale = min(1.0, novel_rows / real_novel_rows) if real_novel_rows > 0 else 1.0
    out = scaled_config(single_process(cfg), scale)
    out.data.batch_size = max(1, round(out.data.batch_size / workers))
    out.run.num_workers = workers
    return out


@dataclass
class TrialSettings:
    """What every trial of one search shares; stored with the experiment (JSON) so a resumed search keeps it.

    ``cfg``: the trials' base Config (``data.features`` = the validation table). ``train_storage``: where each
    trial's TorchTrainer keeps its checkpoints. ``pg_registry``: the name of the placement-group registry.
    """

    cfg: Config
    target_num_novel: int  #: Ku of the real run (γ's units)
    val_num_novel: int  #: Ku' of the validation problem
    gamma_transfer: bool  #: trials run with γ·Ku'/Ku
    workers: int
    cpus_per_trial: float
    gpus_per_trial: float
    train_storage: str
    pg_registry: str

    def trial_gamma(self, gamma: float) -> float:
        return trial_gamma(gamma, self.val_num_novel, self.target_num_novel, self.gamma_transfer)

    def trial_config(self, gamma: float, alpha: float, output: Path, reg_m: float | None = None) -> Config:
        """The Config one trial trains: γ (transferred), α (and ``reg_m`` when searched) set, the trial's resources,
        no final evaluation, a checkpoint every epoch (ASHA and the validation scorer read each epoch's report and
        checkpoint)."""
        cfg = apply_trial_params(self.cfg, self.trial_gamma(gamma), alpha, reg_m)
        cfg.run.output, cfg.run.evaluate, cfg.run.checkpoint_every_s = str(output), False, 0.0
        cfg.run.num_workers, cfg.run.cpus_per_worker = self.workers, self.cpus_per_trial / self.workers
        cfg.run.use_gpu = "true" if self.gpus_per_trial > 0 else "false"
        return cfg

    def to_json(self) -> str:
        return json.dumps({**{f.name: getattr(self, f.name) for f in fields(self)}, "cfg": self.cfg.to_dict()},
                          indent=2)

    @classmethod
    def from_json(cls, text: str) -> TrialSettings:
        data = json.loads(text)
        return cls(**{**data, "cfg": from_dict(data["cfg"])})


@dataclass
class ScoringRows:
    """The rows a trial is scored on (``features [n, D]``, view 0; ``labels [n]``) and what scoring needs.

    On a known-class problem, the validation table's held-out ``val`` rows, scored by
    :func:`~ncdlr.service.validation.validation_scores`. On a planted problem (``planted`` set: the table's
    :class:`~ncdlr.service.validation.ValidationSplit`), the ``novel`` training rows — the planted classes and the
    real pool — scored by :func:`~ncdlr.service.validation.planted_scores`. With a post-hoc fix (``posthoc``, the
    trial's ``method.posthoc``), the table's known training rows with their labels and its novel training rows
    (view 0) come along, and each checkpoint's predictions are those of the fix fitted on them (:meth:`predict`), as
    the run's own evaluation would give.
    """

    features: torch.Tensor
    labels: np.ndarray
    num_known: int
    num_novel: int
    train_counts: list[int]
    planted: ValidationSplit | None = None
    posthoc: str = "none"
    #: ``(known rows [Nk, ...], their labels [Nk], novel rows [Nu, ...])`` of the table (view 0), with a fix only
    fit_rows: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    @classmethod
    def of(cls, splits: FeatureSplits, posthoc: str = "none") -> ScoringRows:
        info = ValidationSplit(**splits.metadata["validation"]) if "validation" in splits.metadata else None
        planted = info is not None and info.planted
        rows = first_view(splits.features["novel" if planted else SCORING_SPLIT])
        fit = None if posthoc == "none" else (first_view(splits.features["known"]), splits.labels["known"],
                                              rows if planted else first_view(splits.features["novel"]))
        labels = splits.labels["novel" if planted else SCORING_SPLIT].numpy()
        return cls(rows, labels, splits.num_known, splits.num_novel, splits.train_counts(), info if planted else None,
                   posthoc, fit)

    def predict(self, model, cfg: Config) -> np.ndarray:
        """``[n]`` predictions of the trained ``model`` for these rows (argmax over all K, on CPU), after the trial's
        post-hoc fix when it has one (:func:`ncdlr.methods.fit_posthoc` on :attr:`fit_rows`; ``cfg``'s temperature,
        cRT epochs and seed)."""
        from ncdlr.methods import build_method, fit_posthoc

        from .local import embed_inputs
        from .train_loop import predict

        if self.posthoc == "none":
            return predict(model, list(self.features.split(cfg.data.eval_batch_size)), torch.device("cpu"))
        method = build_method(cfg.method, cfg.labeler, model.num_novel)
        model.eval()
        known, known_labels, novel = self.fit_rows
        batch = cfg.data.eval_batch_size
        # the rows are at view 0 already (first_view in :meth:`of`): embedded as model inputs, never viewed again
        z = embed_inputs(model, self.features, batch)
        z_novel = z if novel is self.features else embed_inputs(model, novel, batch)  # a planted problem: its pool
        fix = fit_posthoc(self.posthoc, embed_inputs(model, known, batch), known_labels.long(), z_novel,
                          method.predict_logits(model, z_novel)[:, self.num_known:], model.class_prototypes(),
                          temperature=cfg.method.temperature, crt_epochs=cfg.method.crt_epochs, seed=cfg.run.seed)
        return fix.apply(z, method.predict_logits(model, z)).argmax(1).numpy()

    def scores(self, y_pred: np.ndarray) -> dict[str, float]:
        """The trial's score (and its parts) from its predictions ``[n]`` of these rows."""
        if self.planted is not None:
            return planted_scores(self.labels, y_pred, self.planted)
        return validation_scores(self.labels, y_pred, self.num_known, self.train_counts)


class ValidationScoreCallback(UserCallback):
    """Train → trial bridge that scores each reported checkpoint on its :class:`ScoringRows` (the ``val`` rows, or
    the ``novel`` rows of a planted problem).

    Runs on the Ray Train controller: after every epoch report (rank 0 checkpoints each epoch) it loads the
    checkpoint's model, predicts ``val`` and puts ``{training metrics, score, ..., checkpoint_path}`` on
    ``results`` (a one-slot ``ray.util.queue.Queue``: the controller waits until the trial took the last
    epoch, so ASHA decides before the next one). The trial reports it to Tune (:func:`fit_reporting_to_tune`).
    ``rows``: an object ref of the :class:`ScoringRows` (read once, by the trial).
    """

    def __init__(self, cfg: Config, rows: ray.ObjectRef, env: dict[str, str], results):
        self._cfg, self._rows_ref, self._env, self._results = cfg, rows, env, results
        self._rows: ScoringRows | None = None

    def __setstate__(self, state: dict) -> None:
        # Unpickled in the controller process: give it the driver's S3 settings before any storage access.
        self.__dict__.update(state)
        os.environ.update(self._env)

    def after_report(self, run_context, metrics, checkpoint):
        from .evaluate import load_trained_model

        row = dict(metrics[0])
        if checkpoint is not None:
            if self._rows is None:
                self._rows = ray.get(self._rows_ref)
            rows = self._rows
            with checkpoint.as_directory() as directory:
                model, _ = load_trained_model(self._cfg, directory, rows.num_known, rows.num_novel)
            row.update(rows.scores(rows.predict(model, self._cfg)))
            row[CHECKPOINT_PATH_KEY] = checkpoint.path  # as TuneReportCallback: Tune keeps the path
        self._results.put(row)


def fit_reporting_to_tune(fit, results, poll_s: float = 0.5):
    """Run ``fit()`` (a TorchTrainer's) in a helper thread and ``tune.report`` what arrives on ``results``
    from the calling thread, the trial's own; return ``fit()``'s value once every result is reported (its
    error is raised). Reporting from the function's thread keeps Tune's one-slot result queue single-producer:
    the function's end-of-trial report comes after the last epoch, never beside it (see the module note)."""
    outcome: dict[str, Any] = {}

    def target():
        try:
            outcome["value"] = fit()
        except BaseException as error:  # noqa: BLE001 - re-raised in the trial's thread
            outcome["error"] = error

    runner = threading.Thread(target=target, name="torch-trainer-fit", daemon=True)
    runner.start()
    while True:
        finished = not runner.is_alive()  # checked before the get: a result put before the end is seen
        try:
            tune.report(results.get(timeout=poll_s))
        except Empty:
            if finished:
                break
    runner.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def run_trial(config: dict, settings: TrialSettings, env: dict[str, str]) -> None:
    """Tune function trainable: one (γ, α) = ``config["gamma"], config["alpha"]`` (and ``config["reg_m"]`` when the
    search has it) trained with the real trainer.

    ``settings`` and ``env`` (the driver's ``AWS_*`` variables, applied by the trial, the Train controller and
    the workers) come through ``tune.with_parameters``, so credentials stay out of the stored experiment.
    """
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig

    from .buffer_cap import fill_buffer_cap
    from .num_novel import model_num_novel
    from .run_data import load_training_data, model_for_table
    from .trainer import run_torch_trainer

    os.environ.update(env)
    context = tune.get_context()
    trial_id = context.get_trial_id()
    cfg = settings.trial_config(config["gamma"], config["alpha"], Path(context.get_trial_dir()) / "run",
                                config.get("reg_m"))
    data = load_training_data(cfg.data)
    model_for_table(cfg, data.features)
    workers, use_gpu = settings.workers, settings.gpus_per_trial > 0
    fill_buffer_cap(cfg, data.summary.novel_rows, world=workers, max_steps=cfg.data.max_steps_per_epoch)
    save_config(cfg, Path(cfg.run.output) / "config.yaml")

    resources = {"CPU": cfg.run.cpus_per_worker, **({"GPU": settings.gpus_per_trial / workers} if use_gpu else {})}
    storage_fs, storage_path = ray_storage(settings.train_storage)
    results = Queue(maxsize=1, actor_options={"num_cpus": 0})
    scoring = ValidationScoreCallback(cfg, ray.put(ScoringRows.of(data.features, cfg.method.posthoc)), env, results)
    fit_reporting_to_tune(lambda: run_torch_trainer(
        cfg, data, _train_worker_in_trial,
        actor_name=f"buffer-tune-{trial_id}-{uuid.uuid4().hex[:6]}",
        num_novel=model_num_novel(cfg, data.summary),
        extra_loop_config={"trial_id": trial_id, "pg_registry": settings.pg_registry},
        scaling_config=ScalingConfig(num_workers=workers, use_gpu=use_gpu, resources_per_worker=resources),
        # A fixed name per trial: a restored trial's TorchTrainer resumes from its own last checkpoint.
        run_config=RunConfig(name=f"trial-{trial_id}", storage_path=storage_path, storage_filesystem=storage_fs,
                             checkpoint_config=CheckpointConfig(num_to_keep=1),
                             failure_config=FailureConfig(max_failures=cfg.run.max_failures),
                             callbacks=[scoring]),
    ), results)


def trainable(settings: TrialSettings):
    """:func:`run_trial` for the Tuner: bound to ``settings`` and the driver's ``AWS_*`` variables, with the
    small resources of a function that only waits for its TorchTrainer."""
    env = {k: v for k, v in os.environ.items() if k.startswith("AWS_")}
    return tune.with_resources(tune.with_parameters(run_trial, settings=settings, env=env), {"CPU": 0.01})


# -- placement groups of stopped trials ------------------------------------------------------------------------


def _train_worker_in_trial(config: dict) -> None:
    """:func:`ncdlr.service.worker.train_worker`, after rank 0 registers the worker group's placement group."""
    from .worker import train_worker

    group = ray.util.get_current_placement_group()
    if group is not None and ray.train.get_context().get_world_rank() == 0:
        registry = ray.get_actor(config["pg_registry"], namespace="ncdlr")
        ray.get(registry.add.remote(config["trial_id"], group.id.hex()))
    train_worker(config)


@ray.remote(num_cpus=0)
class PlacementGroupRegistry:
    """Trial id → the placement groups its TorchTrainer created."""

    def __init__(self):
        self.groups: dict[str, set[str]] = {}

    def add(self, trial_id: str, group: str) -> None:
        self.groups.setdefault(trial_id, set()).add(group)

    def pop(self, trial_id: str) -> list[str]:
        return sorted(self.groups.pop(trial_id, set()))


def placement_group_registry(name: str):
    """The named :class:`PlacementGroupRegistry` actor (created if absent); hold the handle during the search."""
    return PlacementGroupRegistry.options(name=name, namespace="ncdlr", get_if_exists=True).remote()


class ReleaseStoppedTrialGroups(tune.Callback):
    """A Tune callback that removes the placement groups of every trial that ends.

    Ray Train V2 creates its worker group's placement group from the controller actor, and a placement group
    lives as long as the job that created it, not the actor. When ASHA (or an interruption) stops a trial,
    Tune ends the trial actor, the controller dies with it and never removes the group: its CPUs stay
    reserved and later trials wait for them forever. A trial that finishes normally has already removed it.
    """

    def __init__(self, registry_name: str):
        self.registry_name = registry_name

    def _release(self, trial) -> None:
        from ray._raylet import PlacementGroupID
        from ray.util.placement_group import PlacementGroup, placement_group_table, remove_placement_group

        registry = placement_group_registry(self.registry_name)
        table = placement_group_table()
        for group in ray.get(registry.pop.remote(trial.trial_id)):
            if table.get(group, {}).get("state") not in (None, "REMOVED"):
                remove_placement_group(PlacementGroup(PlacementGroupID(bytes.fromhex(group))))
                log.info("released the placement group %s of stopped trial %s", group, trial.trial_id)

    def on_trial_complete(self, iteration, trials, trial, **info):
        self._release(trial)

    def on_trial_error(self, iteration, trials, trial, **info):
        self._release(trial)


# -- the Tuner ----------------------------------------------------------------------------------------------------


def make_tuner(settings: TrialSettings, storage: ExperimentStorage, space: SearchSpace, *, num_samples: int,
               max_concurrent: int, grace_period: int, reduction_factor: float, seed: int) -> tune.Tuner:
    """A new search: random (γ, α) after the explicit candidates, ASHA over epochs (``grace_period`` 0 → half
    the epochs: early validation scores are noisy), results ranked by ``score``."""
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search.basic_variant import BasicVariantGenerator

    params, points = space.tune_space()
    epochs = settings.cfg.optim.epochs
    scheduler = ASHAScheduler(time_attr="epoch", max_t=epochs, grace_period=grace_period or max(1, epochs // 2),
                              reduction_factor=reduction_factor)
    # max_concurrent_trials is ignored with a BasicVariantGenerator: its own max_concurrent limits the trials.
    search = BasicVariantGenerator(points_to_evaluate=points, max_concurrent=max_concurrent, random_state=seed)
    return tune.Tuner(
        trainable(settings), param_space=params,
        tune_config=tune.TuneConfig(metric="score", mode="max", scheduler=scheduler, num_samples=num_samples,
                                    search_alg=search),
        run_config=tune.RunConfig(name=storage.name, storage_path=storage.root_path,
                                  storage_filesystem=storage.ray_filesystem, verbose=1,
                                  callbacks=[ReleaseStoppedTrialGroups(settings.pg_registry)]),
    )


def restore_tuner(settings: TrialSettings, storage: ExperimentStorage) -> tune.Tuner:
    """The stored search (``Tuner.restore``): its space and scheduler kept, unfinished and errored trials resumed."""
    return tune.Tuner.restore(storage.path, trainable(settings), resume_unfinished=True, resume_errored=True,
                              storage_filesystem=storage.ray_filesystem)


def fit_search(tuner: tune.Tuner, settings: TrialSettings):
    """``tuner.fit()`` with the placement-group registry alive for the whole search; the Tune ``ResultGrid``."""
    registry = placement_group_registry(settings.pg_registry)  # noqa: F841 - the handle keeps the actor alive
    return tuner.fit()


def trial_rows(result_grid, settings: TrialSettings) -> list[dict]:
    """One row per trial of a Tune ``ResultGrid``: γ (config units and as trained), α, ``reg_m``, status, last
    metrics."""
    rows = []
    epochs = settings.cfg.optim.epochs
    for result in result_grid:
        metrics = result.metrics or {}
        gamma, alpha = float(result.config["gamma"]), float(result.config["alpha"])
        if result.error:
            status = "error"
        elif metrics.get("epoch") is None:
            status = "not run"
        else:  # fewer epochs: stopped by ASHA (or by an interruption, until the search is resumed)
            status = "completed" if metrics["epoch"] == epochs else "stopped"
        reg_m = float(result.config.get("reg_m", settings.cfg.labeler.reg_m))
        rows.append({"trial": metrics.get("trial_id") or Path(result.path).name, "gamma": gamma,
                     "gamma_trial": settings.trial_gamma(gamma), "alpha": alpha, "reg_m": reg_m, "status": status,
                     **{k: metrics.get(k) for k in ("epoch", "score", "score_head", "score_medium", "score_tail",
                                                    "score_min", "val_all", "val_known", "tau", "loss")}})
    return rows


# -- storage: Ray Tune/Train on a local folder or s3:// ---------------------------------------------------------


@dataclass(frozen=True)
class ExperimentStorage:
    """The experiment folder ``<root>/<name>`` of a search: Tune's experiment, ``validation.parquet``,
    ``search_settings.json`` and ``train/`` (the trials' TorchTrainer runs)."""

    root: str  #: the storage URI (local folder or s3://bucket/prefix)
    name: str
    root_path: str  #: ``root`` inside :attr:`filesystem`
    filesystem: pafs.FileSystem
    ray_filesystem: pafs.FileSystem | None  #: what Ray is given (None: a local path)

    @classmethod
    def open(cls, root: str, name: str) -> ExperimentStorage:
        ray_fs, root_path = ray_storage(root)
        return cls(root, name, root_path, ray_fs or pafs.LocalFileSystem(), ray_fs)

    @property
    def path(self) -> str:
        """The experiment inside :attr:`filesystem` (Tune's experiment path)."""
        return f"{self.root_path}/{self.name}"

    @property
    def uri(self) -> str:
        return join(self.root, self.name) if is_s3(self.root) else self.path

    def child(self, name: str) -> str:
        """The URI of ``name`` inside the experiment (what the feature-table and Train code take)."""
        return join(self.uri, name)

    def exists(self, name: str) -> bool:
        return self.filesystem.get_file_info(f"{self.path}/{name}").type == pafs.FileType.File

    def read_text(self, name: str) -> str:
        with self.filesystem.open_input_stream(f"{self.path}/{name}") as stream:
            return stream.read().decode()

    def write_text(self, name: str, text: str) -> None:
        if self.ray_filesystem is None:  # local: make the folders (S3 needs none, and rclone refuses markers)
            self.filesystem.create_dir(self.path, recursive=True)
        with self.filesystem.open_output_stream(f"{self.path}/{name}") as stream:
            stream.write(text.encode())

    def can_restore(self) -> bool:
        """Whether a Tune experiment is stored here (the search then resumes)."""
        return tune.Tuner.can_restore(self.path, storage_filesystem=self.ray_filesystem)


def new_trial_settings(cfg: Config, storage: ExperimentStorage, *, target_num_novel: int, val_num_novel: int,
                       gamma_transfer: bool, workers: int, cpus_per_trial: float,
                       gpus_per_trial: float) -> TrialSettings:
    """Settings of a new search: trials' TorchTrainer runs under ``<experiment>/train``, a fresh registry name."""
    return TrialSettings(cfg, target_num_novel, val_num_novel, gamma_transfer, workers, cpus_per_trial,
                         gpus_per_trial, storage.child("train"), f"gamma-search-groups-{uuid.uuid4().hex[:8]}")

