"""``model.num_novel`` (0 | N | auto) and the oracle counts of ``labeler.prior=fixed``, wired as the trainer does.

No Ray Train here: ``tests.fixtures.tiny_runs.make_run_dir`` runs the same resolve → build_model →
build_worker_state → train → checkpoint chain as ``fit``/``train_worker`` on a tiny feature table, and
``evaluate_run`` reads the run directory as ``ncdlr evaluate`` does.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest
import torch

from ncdlr.commands import train as train_command
from ncdlr.service.config import ConfigError, Config, from_dict, load_config
from ncdlr.service.evaluate import evaluate_run
from ncdlr.service.num_novel import (ESTIMATE_FILE, fixed_prior_counts, model_num_novel, read_estimate,
                                     resolve_num_novel)
from ncdlr.methods import build_method
from ncdlr.service.run_data import DatasetSummary, load_training_data
from ncdlr.models import build_model
from tests.fixtures.tiny_runs import TINY_KS, TINY_KU, make_run_dir, tiny_config, write_tiny_table


def _summary(num_known=3, num_novel=4, counts=(9, 8, 7, 20, 10, 5, 1)) -> DatasetSummary:
    return DatasetSummary(num_known, num_novel, 8, sum(counts[num_known:]), [f"c{i}" for i in range(len(counts))],
                          list(counts))


# -- config ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("given, stored", [("auto", "auto"), ("7", "7"), ("0", "0")])
def test_num_novel_flag_accepts_auto_and_counts(given, stored):
    parser = argparse.ArgumentParser()
    train_command.add_arguments(parser)
    cfg = train_command.build_config(parser.parse_args(["--features", "t.parquet", "--num-novel", given]))
    assert cfg.model.num_novel == stored


def test_num_novel_as_a_yaml_integer_is_kept(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model:\n  num_novel: 12\n")
    assert load_config(path).model.num_novel == "12"
    assert from_dict({"model": {"num_novel": "auto"}}).model.num_novel == "auto"


@pytest.mark.parametrize("bad", ["-3", "many", "1.5", ""])
def test_bad_num_novel_is_refused_naming_the_key(bad):
    with pytest.raises(ConfigError, match="model.num_novel"):
        load_config(None, ["--num-novel", bad])


# -- the model's Ku --------------------------------------------------------------------------------------------

def test_model_num_novel_zero_takes_the_data_and_n_overrides():
    cfg = Config()
    assert model_num_novel(cfg, _summary()) == 4
    cfg.model.num_novel = "9"
    assert model_num_novel(cfg, _summary()) == 9


def test_unresolved_auto_is_refused():
    cfg = Config()
    cfg.model.num_novel = "auto"
    with pytest.raises(ValueError, match="auto"):
        model_num_novel(cfg, _summary())


def test_resolve_auto_estimates_ku_on_the_feature_table_and_records_it(tmp_path):
    table = write_tiny_table(tmp_path / "f.parquet")
    cfg = tiny_config(table, tmp_path, model={"num_novel": "auto"})
    record = resolve_num_novel(cfg, load_training_data(cfg.data), tmp_path)
    assert abs(record["num_novel"] - TINY_KU) <= 0.2 * TINY_KU  # well-separated clusters: within ±20 %
    assert cfg.model.num_novel == str(record["num_novel"])
    assert record["num_novel_true"] == TINY_KU and record["features"] == table
    assert read_estimate(tmp_path) == json.loads((tmp_path / ESTIMATE_FILE).read_text()) == record


def test_resolve_leaves_numbers_alone(tmp_path):
    cfg = tiny_config(write_tiny_table(tmp_path / "f.parquet"), tmp_path, model={"num_novel": "7"})
    assert resolve_num_novel(cfg, load_training_data(cfg.data), tmp_path) is None
    assert cfg.model.num_novel == "7" and read_estimate(tmp_path) is None


def test_auto_run_trains_and_evaluates_with_the_estimated_ku(tmp_path):
    run, cfg = make_run_dir(tmp_path, model={"num_novel": "auto"})
    saved = load_config(run / "config.yaml")
    assert saved.model.num_novel == cfg.model.num_novel != "auto"  # the resolved config holds the number
    metrics = evaluate_run(run)
    estimate = read_estimate(run)["num_novel"]
    assert metrics["num_novel_estimated"] == metrics["num_novel"] == estimate
    assert json.loads((run / "metrics.json").read_text())["num_novel_estimated"] == estimate
    assert 0.0 <= metrics["novel"] <= 1.0


def test_a_fixed_number_of_clusters_other_than_the_data_trains_and_evaluates(tmp_path):
    run, _ = make_run_dir(tmp_path, model={"num_novel": "8"})  # data: 5 novel classes
    metrics = evaluate_run(run)
    assert metrics["num_novel"] == 8 and "num_novel_estimated" not in metrics
    assert 0.0 <= metrics["all"] <= 1.0  # Hungarian matching over Ks + 8 predicted ids


# -- labeler.prior=fixed (oracle) -------------------------------------------------------------------------------

def test_fixed_prior_gets_the_true_novel_training_counts():
    cfg = Config()
    cfg.labeler.prior = "fixed"
    assert torch.equal(fixed_prior_counts(cfg, _summary()), torch.tensor([20.0, 10.0, 5.0, 1.0]))
    cfg.labeler.prior = "adaptive"
    assert fixed_prior_counts(cfg, _summary()) is None


def test_fixed_prior_with_another_ku_is_refused():
    cfg = Config()
    cfg.labeler.prior, cfg.model.num_novel = "fixed", "6"
    with pytest.raises(ValueError, match="prior=fixed"):
        fixed_prior_counts(cfg, _summary())


def test_fixed_prior_with_no_novel_training_rows_is_refused():
    cfg = Config()
    cfg.labeler.prior = "fixed"
    with pytest.raises(ValueError, match="all zero"):
        fixed_prior_counts(cfg, _summary(counts=(9, 8, 7, 0, 0, 0, 0)))


def test_build_method_gives_the_fixed_prior_its_counts(tmp_path):
    cfg = tiny_config(write_tiny_table(tmp_path / "f.parquet"), tmp_path, labeler={"prior": "fixed"})
    summary = load_training_data(cfg.data).summary
    with pytest.raises(ValueError, match="fixed_prior"):  # the failure the service had before
        build_method(cfg.method, cfg.labeler, TINY_KU)
    method = build_method(cfg.method, cfg.labeler, TINY_KU, fixed_prior=fixed_prior_counts(cfg, summary))
    novel_counts = np.asarray(summary.train_counts[TINY_KS:], dtype=float)
    expected = np.sort(novel_counts)[::-1] / novel_counts.sum()
    assert np.allclose(method.labeler.prior.ranked.numpy(), expected)


def test_fixed_prior_run_trains_and_evaluates(tmp_path):
    run, _ = make_run_dir(tmp_path, labeler={"prior": "fixed"})
    assert 0.0 <= evaluate_run(run)["novel"] <= 1.0


# -- labeler.max_imbalance = 0: the known classes' own imbalance ---------------------------------------------

def test_known_measures_are_filled_in_from_the_known_classes_where_the_labeler_reads_them():
    """``labeler.size_floor = known`` is the rarest known class's training count over the novel training rows
    (7 / 36 here; a known class with no row is left out); ``max_imbalance = 0`` under the priors that read it is
    the known classes' ``n_max / n_min`` (9 / 7). A value given is kept; a labeler that reads neither is left alone."""
    from ncdlr.service.num_novel import fill_from_known

    summary = _summary(num_known=4, counts=(9, 8, 7, 0, 20, 10, 5, 1))
    cfg = from_dict({"labeler": {"prior": "uniform", "reg_m": 0.45, "size_floor": "known"}})
    assert fill_from_known(cfg, summary.train_counts, summary.num_known, summary.novel_rows) == {
        "labeler.size_floor": f"{7 / 36:.6g}"}
    assert float(cfg.labeler.size_floor) == pytest.approx(7 / 36, rel=1e-5)
    anchored = from_dict({"labeler": {"prior": "anchored"}})
    assert fill_from_known(anchored, summary.train_counts, summary.num_known, 36) == {"labeler.max_imbalance": 9 / 7}
    given = from_dict({"labeler": {"prior": "anchored", "max_imbalance": 40.0}})
    assert fill_from_known(given, summary.train_counts, summary.num_known, 36) == {}
    assert given.labeler.max_imbalance == 40.0
    bounded = from_dict({"labeler": {"prior": "uniform", "reg_m": 0.45, "relax_bound": "known"}})
    assert fill_from_known(bounded, summary.train_counts, summary.num_known, 36) == {"labeler.relax_bound": f"{9 / 7:.6g}"}
    held = from_dict({"labeler": {"relax_bound": "known"}})  # reg_m 0: inert, left as given
    assert fill_from_known(held, summary.train_counts, summary.num_known, 36) == {}
    with pytest.raises(ConfigError, match="relax_bound=known: the known classes' training counts are all equal"):
        fill_from_known(from_dict({"labeler": {"prior": "uniform", "reg_m": 0.45, "relax_bound": "known"}}),
                        [4, 4, 5, 3], 2, 8)
    with pytest.raises(ConfigError, match="labeler.relax_bound=known stands for a measure of the known classes"):
        fill_from_known(from_dict({"labeler": {"prior": "uniform", "reg_m": 0.45, "relax_bound": "known"}}),
                        [0, 0, 5, 3], 2, 8)
    plain = Config()
    assert fill_from_known(plain, summary.train_counts, summary.num_known, 36) == {}
    assert plain.labeler.max_imbalance == 0.0 and plain.labeler.size_floor == "none"
    with pytest.raises(ConfigError, match="no known class has a training row"):
        fill_from_known(from_dict({"labeler": {"prior": "bounded"}}), [0, 0, 5, 3], 2, 8)
    with pytest.raises(ConfigError, match="no novel training rows"):
        fill_from_known(from_dict({"labeler": {"prior": "uniform", "reg_m": 0.45, "size_floor": "known"}}),
                        [4, 2, 5, 3], 2, 0)


def test_a_size_floor_from_the_known_classes_trains_and_is_recorded_in_the_run(tmp_path):
    """The trainer's chain on a tiny table: ``size_floor = known`` trains and evaluates; the run's config records the
    share it stood for."""
    run, _ = make_run_dir(tmp_path, labeler={"prior": "uniform", "reg_m": 0.45, "size_floor": "known"})
    cfg = load_config(run / "config.yaml")
    assert 0 < float(cfg.labeler.size_floor) < 1
    metrics = evaluate_run(run)
    assert 0.0 <= metrics["novel"] <= 1.0


def test_a_relax_bound_from_the_known_classes_trains_and_is_recorded_in_the_run(tmp_path):
    """The trainer's chain on a tiny table: ``relax_bound = known`` trains and evaluates; the run's config records the
    known classes' n_max/n_min it stood for."""
    run, _ = make_run_dir(tmp_path, labeler={"prior": "uniform", "reg_m": 0.45, "relax_bound": "known"})
    cfg = load_config(run / "config.yaml")
    assert float(cfg.labeler.relax_bound) > 1
    metrics = evaluate_run(run)
    assert 0.0 <= metrics["novel"] <= 1.0
