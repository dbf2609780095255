"""tuning/gamma_search.py: ranking, best config accepted by the trainer, --help, refusals, a tiny Tune run."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.fs as pafs
import pytest
from ray import tune

from ncdlr.service.config import Config, load_config
from ncdlr.service.tune import UNIFORM
from tests.fixtures.activation_caches import write_activation_cache
from tuning.gamma_search import format_table, main, rank_trials, write_best_config

ROOT = Path(__file__).parents[2]


def test_completed_trials_rank_above_stopped_ones_and_uniform_is_labelled():
    rows = [{"gamma": 10.0, "alpha": 1.0, "epoch": 2, "score": 0.9, "trial": "a"},
            {"gamma": UNIFORM, "alpha": 1.0, "epoch": 8, "score": 0.5, "trial": "b"},
            {"gamma": 100.0, "alpha": 2.0, "epoch": 8, "score": 0.6, "trial": "c"}]
    ranked = rank_trials(rows)
    assert [r["trial"] for r in ranked] == ["c", "b", "a"]
    assert "∞ (uniform)" in format_table(ranked)


@pytest.mark.parametrize("gamma", [37.5, UNIFORM])
def test_best_config_is_accepted_unchanged_by_both_training_entry_points(tmp_path, gamma):
    from ncdlr.commands import train as train_command
    from ncdlr.train_inat2k import build_parser as inat_parser

    base = load_config(ROOT / "configs" / "openclipart.yaml")
    path = tmp_path / "best.yaml"
    loaded = write_best_config(base, {"gamma": gamma, "alpha": 0.7}, path, "best of 3 trials\nsecond line")
    assert path.read_text().startswith("# best of 3 trials\n# second line\n")
    assert loaded.optim.alpha == 0.7
    assert loaded.labeler.prior == ("uniform" if math.isinf(gamma) else "adaptive")
    if math.isfinite(gamma):
        assert loaded.labeler.gamma == gamma
    assert loaded.data.uri == base.data.uri and loaded.model.encoder == "efficientnet_lite0"

    import argparse

    parser = argparse.ArgumentParser()
    train_command.add_arguments(parser)
    cfg = train_command.build_config(parser.parse_args(["--config", str(path)]))
    assert cfg.to_dict() == loaded.to_dict()
    args = inat_parser().parse_args(["--config", str(path)])
    assert load_config(args.config).to_dict() == loaded.to_dict()


def test_a_searched_size_relaxation_reaches_the_table_and_best_yaml(tmp_path):
    rows = rank_trials([{"gamma": UNIFORM, "alpha": 1.0, "reg_m": 0.45, "epoch": 8, "score": 0.7, "trial": "u"},
                        {"gamma": 10.0, "alpha": 1.0, "reg_m": 0.0, "epoch": 8, "score": 0.6, "trial": "h"}])
    table = format_table(rows)
    assert "reg_m (sizes)" in table and "| 0.45 |" in table and "| held |" in table
    base = load_config(ROOT / "configs" / "openclipart.yaml")
    loaded = write_best_config(base, rows[0], tmp_path / "best.yaml", "best")
    assert (loaded.labeler.prior, loaded.labeler.reg_m) == ("uniform", 0.45)


def test_a_planted_search_names_its_score_and_drops_the_known_problem_columns():
    rows = rank_trials([{"gamma": UNIFORM, "alpha": 1.0, "reg_m": 0.45, "epoch": 2, "score": 0.7, "score_min": 0.4,
                         "trial": "u"}])
    planted, known = format_table(rows, planted=True), format_table(rows)
    assert "score (planted F1)" in planted and "worst planted class" in planted and "| 0.400 |" in planted
    assert "| H |" not in planted and "val all" not in planted
    assert "score (pseudo-novel)" in known and "worst planted class" not in known


def test_the_plot_gives_each_searched_size_relaxation_its_own_markers(tmp_path):
    from ncdlr.service.tune import SearchSpace
    from tuning.gamma_search import plot_scores

    space = SearchSpace(1.0, 100.0, 0.25, 4.0, True, (0.0, 0.45))
    rows = [{"gamma": g, "alpha": 1.0, "reg_m": r, "epoch": 2, "score": 0.5}
            for g in (UNIFORM, 10.0) for r in (0.0, 0.45)]
    labels = plot_scores(rows, tmp_path / "relaxed.png", space, planted=True)
    assert labels == ["γ finite, sizes held", "uniform prior (γ = ∞), sizes held", "γ finite, reg_m 0.45",
                      "uniform prior (γ = ∞), reg_m 0.45"]
    assert (tmp_path / "relaxed.png").stat().st_size > 1000
    held = [r for r in rows if r["reg_m"] == 0.0]
    assert plot_scores(held, tmp_path / "held.png", space) == ["uniform prior (γ = ∞)"]  # one star, one label


def test_an_experiment_made_on_one_problem_is_not_resumed_on_the_other(tmp_path, capsys):
    """The stored validation table says which problem the experiment searches; --problem planted on an experiment
    made with the known-class problem (and the reverse) is one line and exit 2, before Ray starts."""
    from ncdlr.data.features import synthetic_features, write_feature_table
    from ncdlr.service.tune import ExperimentStorage
    from ncdlr.service.validation import build_validation_table

    x, y, s = synthetic_features(num_known=10, num_novel=10, dim=8, n_max=60, ratio=10, test_per_class=4, seed=1)
    table = str(tmp_path / "features.parquet")
    write_feature_table(table, x, y, s, num_known=10, num_novel=10)
    for made, asked in (("known", "planted"), ("planted", "known")):
        storage = ExperimentStorage.open(str(tmp_path / "ray"), made)
        build_validation_table(table, storage.child("validation.parquet"), planted=made == "planted")
        argv = ["--features", table, "--output", str(tmp_path / "out"), "--storage", str(tmp_path / "ray"),
                "--name", made, "--problem", asked]
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert f"made with --problem {made}, not {asked}" in err and len(err.splitlines()) == 1


def _tiny_activation_cache(folder: Path) -> str:
    """A tiny_cnn activation cache (``[V=3, 32, 8, 8]`` per row): 4 known classes, 2 novel, 6 novel rows."""
    import numpy as np

    known = np.repeat(np.arange(4), [8, 6, 5, 4]).tolist()
    return write_activation_cache(folder, {"known": (3, known), "novel": (3, [4, 5] * 3)}, num_known=4)


def test_trials_on_an_activation_cache_train_the_configs_last_block_and_planted_rows_keep_their_views(tmp_path):
    """On an activation cache the trials train what the run trains (the config's last block and head), not a head on
    the frozen block; a planted table of a cache holds the pool's rows with all their cached views."""
    from ncdlr.data.features import read_feature_table
    from ncdlr.service.run_data import model_for_table
    from ncdlr.service.validation import ValidationConfig, build_validation_table
    from tuning.gamma_search import feature_mode

    info = build_validation_table(_tiny_activation_cache(tmp_path / "cache"), str(tmp_path / "val.parquet"),
                                  ValidationConfig(pseudo_novel_fraction=0.5), planted=True)
    table = read_feature_table(str(tmp_path / "val.parquet"))
    assert table.is_activations and table.views("novel") == 3 and info.unlabeled_rows == 6
    assert table.num_novel == info.num_clusters == 2 + 2 and len(table.labels["novel"]) == info.split_counts["novel"]
    base = Config()
    base.model.encoder, base.model.trainable_blocks, base.model.head = "tiny_cnn", 1, "linear"
    trials = feature_mode(base, activations=True)
    model_for_table(trials, table)
    assert (trials.model.encoder, trials.model.trainable_blocks, trials.model.head) == ("tiny_cnn", 1, "linear")
    assert trials.model.num_novel == "0"  # the clusters come from the table: Ku' + Ku when planted
    head_only = feature_mode(base)
    assert (head_only.model.encoder, head_only.model.trainable_blocks) == ("identity", 0)


def test_help_explains_the_protocol_and_the_cluster_flags():
    out = subprocess.run([sys.executable, str(ROOT / "tuning" / "gamma_search.py"), "--help"], capture_output=True,
                         text=True, check=True, cwd=ROOT).stdout
    for phrase in ("never looks at novel labels", "pseudo-novel", "head / medium / tail", "held out",
                   "class-mean accuracy", "uniform-prior limit", "ASHA", "Tuner.restore", "small Ku needs small γ",
                   "--num-samples", "--cpus-per-trial", "--gpus-per-trial", "--storage", "--gamma-min", "--gamma-max",
                   "--resume", "--epochs"):
        assert phrase in out, phrase


def test_bad_arguments_are_reported_in_one_line(tmp_path, capsys):
    assert main(["--features", str(tmp_path / "missing.parquet"), "--output", str(tmp_path / "out")]) == 2
    assert "missing.parquet" in capsys.readouterr().err
    assert main(["--gamma-min", "10", "--gamma-max", "1", "--output", str(tmp_path / "out")]) == 2
    assert "--gamma-min" in capsys.readouterr().err
    assert main(["--reg-m", "0", "-0.45", "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "--reg-m" in err and len(err.strip().splitlines()) == 1
    assert main(["--features", "x.parquet", "--epochs", "lots", "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "optim.epochs" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("flag", ["--gamma", "--labeler.gamma", "--alpha", "--optim.alpha", "--prior",
                                  "--labeler.prior"])
def test_the_searched_fields_are_refused_not_silently_overwritten(tmp_path, capsys, flag):
    value = "uniform" if flag.endswith("prior") else "10"
    assert main(["--features", "x.parquet", flag, value, "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and flag in err
    assert "--gamma-min/--gamma-max" in err and "--alpha-min/--alpha-max" in err
    assert not (tmp_path / "o").exists()  # refused before anything is read or written


def test_the_searched_fields_are_not_offered_as_overrides():
    help_text = subprocess.run([sys.executable, str(ROOT / "tuning" / "gamma_search.py"), "--help"],
                               capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert "--labeler.gamma" not in help_text and "--optim.alpha" not in help_text
    assert "--labeler.prior" not in help_text and "--labeler.lr" in help_text


def _no_placement_group_left(wait_s: float = 20.0) -> bool:
    from ray.util.placement_group import placement_group_table

    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if all(group["state"] == "REMOVED" for group in placement_group_table().values()):
            return True
        time.sleep(0.5)
    return False


@pytest.mark.slow
def test_tiny_tune_run_on_s3_storage_completes_resumes_and_writes_a_config_the_trainer_accepts(
        ray_local, s3_bucket, tmp_path):
    from ncdlr.data.storage import resolve
    from ncdlr.data.features import synthetic_features, write_feature_table

    x, y, s = synthetic_features(num_known=10, num_novel=10, dim=16, n_max=60, ratio=5, test_per_class=4, seed=2)
    table = str(tmp_path / "features.parquet")
    write_feature_table(table, x, y, s, num_known=10, num_novel=10)
    out = tmp_path / "search"
    argv = ["--features", table, "--output", str(out), "--storage", f"{s3_bucket}/tune", "--name", "tiny",
            "--num-samples", "3", "--gamma-min", "1", "--gamma-max", "100", "--epochs", "3", "--batch-size", "32",
            "--buffer-size", "256", "--warmup-epochs", "1", "--max-concurrent", "2"]
    assert main(argv) == 0

    search = json.loads((out / "search.json").read_text())
    assert len(search["trials"]) == 3
    assert any(math.isinf(float(t["gamma"])) for t in search["trials"])  # the uniform candidate ran
    assert all(0.0 <= t["score"] <= 1.0 for t in search["trials"])
    best = load_config(out / "best.yaml")  # the trainer's loader
    assert best.data.features == table and best.model.encoder == "identity"
    assert (out / "gamma_scores.png").stat().st_size > 1000 and "score (pseudo-novel)" in (out / "trials.md").read_text()
    assert _no_placement_group_left(), "a stopped trial's worker placement group was not released"
    fs, path = resolve(f"{s3_bucket}/tune/tiny/validation.parquet")
    assert fs.get_file_info(path).type == pafs.FileType.File
    from ncdlr.service.tune import ExperimentStorage, TrialSettings

    trials = TrialSettings.from_json(ExperimentStorage.open(f"{s3_bucket}/tune", "tiny").read_text(
        "search_settings.json")).cfg  # the run's 32-row step and 256-row buffer scaled by n'/n, as the rehearsal does
    share = search["validation"]["split_counts"]["novel"] / int((s == "novel").sum())
    assert (trials.data.batch_size, trials.labeler.buffer_size) == (max(1, round(32 * share)),
                                                                    max(trials.data.batch_size, round(256 * share)))
    assert trials.data.batch_size < 32

    (out / "search.json").unlink()
    assert main(argv + ["--resume"]) == 0  # Tuner.restore of the finished experiment: same trials, no retraining
    again = json.loads((out / "search.json").read_text())
    assert sorted(t["trial"] for t in again["trials"]) == sorted(t["trial"] for t in search["trials"])


@pytest.mark.slow
def test_a_planted_search_on_an_activation_cache_trains_the_last_block_in_its_trials(ray_local, tmp_path):
    """--problem planted end to end on a local Ray, on an activation cache: the validation table holds the pool, each
    trial trains tiny_cnn's last block and a linear head on the cached views with Ku' + Ku clusters and reports
    the planted F1 (through the config's post-hoc fix, here +LA, fitted on the cached training rows in the Train
    callback), and best.yaml carries the searched size relaxation. ``labeler.buffer_epochs`` reaches the trials,
    which bound their buffer by the validation pool's size."""
    from ncdlr.data.features import read_feature_table
    from ncdlr.service.validation import read_validation_split

    out = tmp_path / "search"
    assert main(["--features", _tiny_activation_cache(tmp_path / "cache"), "--output", str(out), "--name", "planted",
                 "--problem", "planted", "--pseudo-novel-fraction", "0.5", "--reg-m", "0", "0.45",
                 "--num-samples", "2", "--gamma-min", "1", "--gamma-max", "10", "--epochs", "2", "--batch-size", "4",
                 "--buffer-size", "16", "--warmup-epochs", "1", "--model.trainable_blocks", "1", "--model.head",
                 "linear", "--method.posthoc", "la", "--max-concurrent", "2", "--labeler.buffer_epochs", "0.25"]) == 0
    search = json.loads((out / "search.json").read_text())
    assert len(search["trials"]) == 2
    assert all(0.0 <= t["score"] <= 1.0 and t["score_min"] <= t["score"] for t in search["trials"])
    validation = str(out / "ray" / "planted" / "validation.parquet")
    split = read_validation_split(validation)
    assert split.planted and split.unlabeled_rows == 6
    assert read_feature_table(validation).num_novel == split.num_clusters == split.num_novel + 2
    trial_configs = list((out / "ray").rglob("run/config.yaml"))
    assert trial_configs and all((load_config(p).model.encoder, load_config(p).model.trainable_blocks,
                                  load_config(p).method.posthoc) == ("tiny_cnn", 1, "la") for p in trial_configs)
    pool = read_feature_table(validation).features["novel"].shape[0]
    for trial in map(load_config, trial_configs):  # each trial bounds its buffer by its own pool: one step here
        step_rows = 2 * trial.run.num_workers * trial.data.batch_size
        steps = pool // (trial.run.num_workers * trial.data.batch_size)
        assert trial.labeler.buffer_epochs == 0.25 and int(0.25 * steps) <= 1
        assert trial.labeler.buffer_size == step_rows < 16
    assert "score (planted F1)" in (out / "trials.md").read_text()
    best = load_config(out / "best.yaml")
    assert best.labeler.reg_m == search["best"]["reg_m"]
    assert "planted classes' mean F1" in (out / "best.yaml").read_text()


class _SlowDriver(tune.Callback):
    """A Tune callback that takes ``seconds`` per result: the driver of a loaded machine, made repeatable."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def on_trial_result(self, iteration, trials, trial, result, **info):
        time.sleep(self.seconds)


def _trial_wrapping_a_torch_trainer(config: dict) -> None:
    """A function trial as the service runs it: a TorchTrainer whose Train callback hands each epoch to
    :func:`fit_reporting_to_tune` through a one-slot queue."""
    import ray.train
    from ray import tune
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer
    from ray.util.queue import Queue

    from ncdlr.service.tune import fit_reporting_to_tune

    def worker(_):
        for epoch in range(1, 4):
            ray.train.report({"epoch": epoch})

    class Forward(ray.train.UserCallback):
        def __init__(self, queue):
            self.queue = queue

        def after_report(self, run_context, metrics, checkpoint):
            self.queue.put(dict(metrics[0]))

    results = Queue(maxsize=1, actor_options={"num_cpus": 0})
    trainer = TorchTrainer(worker, scaling_config=ScalingConfig(num_workers=1),
                           run_config=RunConfig(name=f"t-{tune.get_context().get_trial_id()}",
                                                storage_path=config["storage"], callbacks=[Forward(results)]))
    fit_reporting_to_tune(trainer.fit, results)


@pytest.mark.slow
def test_a_trial_ends_with_its_last_epoch_reported_even_when_the_tune_driver_lags(ray_local, tmp_path):
    """Regression: with Ray's ``TuneReportCallback`` a driver slower than the trial (a loaded CI machine) let
    ``fit()`` return while the last epoch still waited for the trial's main thread; the end-of-trial report then
    filled Tune's one-slot queue first and the trial stayed RUNNING forever (the search test hung to the 600 s
    timeout). A callback that sleeps 2 s per result makes that order certain; the trial must end, all epochs in."""
    tuner = tune.Tuner(tune.with_resources(_trial_wrapping_a_torch_trainer, {"CPU": 0.01}),
                       param_space={"storage": str(tmp_path / "train")},
                       run_config=tune.RunConfig(storage_path=str(tmp_path / "tune"), verbose=0,
                                                 callbacks=[_SlowDriver(2.0)]))
    results = tuner.fit()
    assert results.num_errors == 0
    assert results[0].metrics["epoch"] == 3 and results[0].metrics["training_iteration"] == 3
