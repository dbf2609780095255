"""ncdlr.service.tune without a Ray cluster: search space, γ transfer, trial configs, stored settings, storage."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from ncdlr.service.config import Config, ConfigError
from ncdlr.service.tune import (
    UNIFORM,
    ExperimentStorage,
    SearchSpace,
    TrialSettings,
    apply_trial_params,
    new_trial_settings,
    trial_base,
    trial_gamma,
)


def test_search_space_contains_the_uniform_candidate():
    params, points = SearchSpace().tune_space()
    assert {"gamma": UNIFORM, "alpha": 1.0} in points
    assert params["gamma"].lower == 50.0 and params["gamma"].upper == 5000.0
    assert params["alpha"].lower == 0.25 and params["alpha"].upper == 4.0
    _, without = SearchSpace(include_uniform=False).tune_space()
    assert without == []


def test_gamma_is_log_uniform_over_the_configured_range():
    params, _ = SearchSpace(gamma_min=1.0, gamma_max=100.0).tune_space()
    draws = [params["gamma"].sample() for _ in range(400)]
    assert 1.0 <= min(draws) and max(draws) <= 100.0
    assert 0.3 < sum(d < 10.0 for d in draws) / len(draws) < 0.7  # log-uniform: half the mass below √(1·100)


@pytest.mark.parametrize("space,flag", [(SearchSpace(gamma_min=100.0, gamma_max=10.0), "--gamma-min"),
                                        (SearchSpace(alpha_min=0.0), "--alpha-min")])
def test_a_bad_range_is_refused_naming_the_flag(space, flag):
    with pytest.raises(ConfigError, match=flag):
        space.tune_space()


def test_the_size_relaxation_is_searched_when_asked_and_the_uniform_candidate_is_tried_with_each_value():
    params, points = SearchSpace(reg_m=(0.0, 0.45)).tune_space()
    assert sorted(params["reg_m"].categories) == [0.0, 0.45]
    assert points == [{"gamma": UNIFORM, "alpha": 1.0, "reg_m": 0.0}, {"gamma": UNIFORM, "alpha": 1.0, "reg_m": 0.45}]
    plain, _ = SearchSpace().tune_space()
    assert "reg_m" not in plain  # not searched: the base config's reg_m
    with pytest.raises(ConfigError, match="--reg-m"):
        SearchSpace(reg_m=(0.0, -0.1)).tune_space()
    relaxed = apply_trial_params(Config(), UNIFORM, 1.0, reg_m=0.45)
    assert (relaxed.labeler.prior, relaxed.labeler.reg_m) == ("uniform", 0.45)
    assert apply_trial_params(Config(), 12.5, 0.5).labeler.reg_m == Config().labeler.reg_m


def test_trial_gamma_keeps_gamma_per_novel_cluster():
    assert trial_gamma(500.0, 4, 20, transfer=True) == pytest.approx(100.0)
    assert trial_gamma(500.0, 4, 20, transfer=False) == 500.0
    assert math.isinf(trial_gamma(UNIFORM, 4, 20, transfer=True))


def test_infinite_gamma_is_the_uniform_prior_and_the_base_is_left_alone():
    base = Config()
    uniform = apply_trial_params(base, UNIFORM, 1.0)
    assert uniform.labeler.prior == "uniform" and math.isfinite(uniform.labeler.gamma)
    finite = apply_trial_params(base, 12.5, 0.5)
    assert (finite.labeler.prior, finite.labeler.gamma, finite.optim.alpha) == ("adaptive", 12.5, 0.5)
    assert base.to_dict() == Config().to_dict()


def test_a_trial_takes_the_real_runs_whole_step_scaled_by_the_validation_problems_share_of_the_novel_rows():
    run = Config()
    run.data.batch_size, run.run.num_workers, run.labeler.buffer_size = 32, 2, 512  # configs/openclipart.yaml's step
    one = trial_base(run, novel_rows=500, real_novel_rows=2000, workers=1)  # n'/n = 1/4
    assert (one.data.batch_size, one.run.num_workers, one.labeler.buffer_size) == (16, 1, 128)
    two = trial_base(run, novel_rows=500, real_novel_rows=2000, workers=2)  # the same 16-row step on two workers
    assert (two.data.batch_size, two.run.num_workers, two.labeler.buffer_size) == (8, 2, 128)
    planted = trial_base(run, novel_rows=2400, real_novel_rows=2000, workers=1)  # the pool holds every real row
    assert (planted.data.batch_size, planted.labeler.buffer_size) == (64, 512)
    no_novel = trial_base(run, novel_rows=500, real_novel_rows=0, workers=4)  # nothing to scale by
    assert (no_novel.data.batch_size, no_novel.labeler.buffer_size) == (16, 512)
    tiny = trial_base(run, novel_rows=1, real_novel_rows=2000, workers=2)
    assert tiny.data.batch_size == 1 and tiny.labeler.buffer_size == 1  # one row per worker at least
    assert (run.data.batch_size, run.run.num_workers, run.labeler.buffer_size) == (32, 2, 512)  # left alone
    with pytest.raises(ConfigError, match="at least one worker"):
        trial_base(run, novel_rows=500, real_novel_rows=2000, workers=0)


def _settings(tmp_path: Path) -> TrialSettings:
    cfg = Config()
    cfg.data.features, cfg.optim.epochs = str(tmp_path / "validation.parquet"), 3
    storage = ExperimentStorage.open(str(tmp_path / "ray"), "tiny")
    return new_trial_settings(cfg, storage, target_num_novel=20, val_num_novel=4, gamma_transfer=True, workers=2,
                              cpus_per_trial=1.0, gpus_per_trial=0.0)


def test_a_trial_trains_the_transferred_gamma_on_its_share_of_the_resources(tmp_path):
    settings = _settings(tmp_path)
    cfg = settings.trial_config(500.0, 2.0, tmp_path / "trial")
    assert cfg.labeler.gamma == pytest.approx(100.0) and cfg.optim.alpha == 2.0
    assert (cfg.run.num_workers, cfg.run.cpus_per_worker, cfg.run.use_gpu) == (2, 0.5, "false")
    assert cfg.run.evaluate is False and cfg.run.output == str(tmp_path / "trial")
    assert settings.cfg.labeler.gamma == Config().labeler.gamma  # the shared base is not changed


def test_trial_settings_survive_a_restart_as_json(tmp_path):
    settings = _settings(tmp_path)
    again = TrialSettings.from_json(settings.to_json())
    assert again.cfg.to_dict() == settings.cfg.to_dict()
    assert {**vars(again), "cfg": None} == {**vars(settings), "cfg": None}
    assert settings.train_storage == str(tmp_path / "ray" / "tiny" / "train")


def test_local_experiment_storage_writes_reads_and_names_its_files(tmp_path):
    storage = ExperimentStorage.open(str(tmp_path / "ray"), "tiny")
    assert storage.uri == str(tmp_path / "ray" / "tiny") and storage.ray_filesystem is None
    assert not storage.exists("search_settings.json") and not storage.can_restore()
    storage.write_text("search_settings.json", "{}")
    assert storage.exists("search_settings.json") and storage.read_text("search_settings.json") == "{}"
    assert storage.child("validation.parquet") == str(tmp_path / "ray" / "tiny" / "validation.parquet")


@pytest.mark.parametrize("planted", [False, True])
def test_a_trial_is_scored_on_the_rows_its_problem_names(tmp_path, planted):
    """ScoringRows of a known-class table: the held-out ``val`` rows and the pseudo-novel accuracy; of a planted
    table: the ``novel`` training rows (planted classes and the pool) and the planted classes' F1."""
    import numpy as np

    from ncdlr.data.features import read_feature_table, synthetic_features, write_feature_table
    from ncdlr.service.tune import ScoringRows
    from ncdlr.service.validation import build_validation_table, planted_scores, validation_scores

    x, y, s = synthetic_features(num_known=10, num_novel=10, dim=8, n_max=60, ratio=10, test_per_class=4, seed=1)
    write_feature_table(str(tmp_path / "src.parquet"), x, y, s, num_known=10, num_novel=10,
                        source_ids=[f"i{j}" for j in range(len(y))])
    info = build_validation_table(str(tmp_path / "src.parquet"), str(tmp_path / "val.parquet"), planted=planted)
    table = read_feature_table(str(tmp_path / "val.parquet"))
    rows = ScoringRows.of(table)
    split = "novel" if planted else "val"
    assert torch.equal(rows.features, table.features[split]) and np.array_equal(rows.labels, table.labels[split])
    assert (rows.planted == info) if planted else rows.planted is None
    guess = np.random.default_rng(0).integers(0, table.num_known + table.num_novel, len(rows.labels))
    expected = (planted_scores(rows.labels, guess, info) if planted
                else validation_scores(rows.labels, guess, table.num_known, table.train_counts()))
    np.testing.assert_equal(rows.scores(guess), expected)  # NaN (a group with no class) equals NaN here
    assert 0.0 <= expected["score"] <= 1.0


@pytest.mark.parametrize("planted", [False, True])
def test_a_trial_with_a_posthoc_fix_is_scored_through_it(tmp_path, planted):
    """A trial of ``method.posthoc la`` (or ``la+crt``) is scored on the predictions its own evaluation would give: the
    fix fitted on the table's known + novel training rows, then applied to the scored rows, equal to the in-memory
    rehearsal's :func:`~ncdlr.service.local.fixed_scores`; without a fix no training rows travel and the plain argmax
    is scored."""
    import numpy as np

    from ncdlr.data.features import read_feature_table, synthetic_features, write_feature_table
    from ncdlr.service.config import load_config
    from ncdlr.service.local import fixed_scores, train
    from ncdlr.service.tune import ScoringRows
    from ncdlr.service.validation import build_validation_table

    x, y, s = synthetic_features(num_known=6, num_novel=6, dim=8, n_max=60, ratio=10, test_per_class=4, seed=2)
    write_feature_table(str(tmp_path / "src.parquet"), x, y, s, num_known=6, num_novel=6,
                        source_ids=[f"i{j}" for j in range(len(y))])
    build_validation_table(str(tmp_path / "src.parquet"), str(tmp_path / "val.parquet"), planted=planted)
    table = read_feature_table(str(tmp_path / "val.parquet"))
    cfg = load_config(None, ["--optim.epochs", "2", "--model.head", "linear", "--data.batch_size", "16",
                             "--labeler.buffer_size", "64", "--run.seed", "3"])
    run = train(cfg, table)
    plain = ScoringRows.of(table)
    assert plain.fit_rows is None
    np.testing.assert_array_equal(plain.predict(run.model, cfg), fixed_scores(run, table, plain.features)["none"]
                                  .argmax(1).numpy())
    changed = 0
    for kind in ("la", "la+crt"):
        cfg.method.posthoc = kind
        rows = ScoringRows.of(table, kind)
        expected = fixed_scores(run, table, rows.features, (kind,), temperature=cfg.method.temperature,
                                crt_epochs=cfg.method.crt_epochs, seed=cfg.run.seed)[kind].argmax(1).numpy()
        got = rows.predict(run.model, cfg)
        np.testing.assert_array_equal(got, expected)
        changed += int((got != plain.predict(run.model, cfg)).sum())
    assert changed > 0  # the fixes move some predictions here, so scoring the plain argmax would fail above


@pytest.mark.parametrize("planted", [False, True])
def test_a_posthoc_fix_scores_a_trial_on_an_activation_cache(tmp_path, planted):
    """On an activation cache (rows ``[V, 32, 8, 8]``) the scored rows are held at view 0 and embedded as they are:
    the +LA trial's predictions equal :func:`~ncdlr.service.local.fixed_scores` on the table's rows with their views.
    (Taking view 0 twice fed a ``[n, 8, 8]`` slice to the block; only the planted Tune end-to-end test, about a
    minute on a Ray cluster, met it before this one.)"""
    import numpy as np

    from ncdlr.data.features import read_feature_table
    from ncdlr.service.config import load_config
    from ncdlr.service.local import fixed_scores, train
    from ncdlr.service.tune import ScoringRows
    from ncdlr.service.validation import build_validation_table
    from tests.fixtures.activation_caches import write_activation_cache

    known = np.repeat(np.arange(4), [8, 6, 5, 4]).tolist()
    source = write_activation_cache(tmp_path / "cache", {"known": (3, known), "novel": (3, [4, 5] * 4),
                                                         "test": (1, [0, 1, 2, 3, 4, 5] * 2)}, num_known=4)
    build_validation_table(source, str(tmp_path / "val.parquet"), planted=planted)
    table = read_feature_table(str(tmp_path / "val.parquet"))
    cfg = load_config(None, ["--optim.epochs", "1", "--model.trainable_blocks", "1", "--model.head", "linear",
                             "--data.batch_size", "4", "--labeler.buffer_size", "16", "--method.posthoc", "la"])
    run = train(cfg, table)
    rows = ScoringRows.of(table, "la")
    assert rows.features.shape[1:] == (32, 8, 8)
    split = "novel" if planted else "val"
    expected = fixed_scores(run, table, table.features[split], ("la",), temperature=cfg.method.temperature,
                            crt_epochs=cfg.method.crt_epochs, seed=cfg.run.seed)["la"].argmax(1).numpy()
    np.testing.assert_array_equal(rows.predict(run.model, cfg), expected)
