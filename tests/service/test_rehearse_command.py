"""``ncdlr rehearse``: config candidates chosen on the user's own table by the planted (or known-class) rehearsal,
recorded per training so that it resumes, with every bad input refused by a one-line error."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ncdlr.cli import main
from ncdlr.data.features import read_feature_table, synthetic_features, write_feature_table
from ncdlr.service import rehearsal
from ncdlr.service.config import ConfigError, load_yaml, resolve
from ncdlr.service.setting_rehearsal import (BASE, Record, RehearsalPlan, candidate_configs, choose, load_record,
                                             parse_candidate, run_rehearsal, single_process, summarise)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TINY = ["--epochs", "2", "--batch-size", "16", "--buffer-size", "64", "--head-dim", "16"]
RELAXED = ["relaxed", "labeler.prior=uniform", "labeler.reg_m=0.45"]


@pytest.fixture
def table(tmp_path):
    x, y, s = synthetic_features(num_known=10, num_novel=6, dim=16, n_max=60, ratio=10, test_per_class=4, seed=1)
    path = str(tmp_path / "table.parquet")
    write_feature_table(path, x, y, s, num_known=10, num_novel=6)
    return path


def rehearse(table, out, *extra, candidates=(RELAXED,), draws=2):
    argv = ["rehearse", "--features", table, "--output", str(out), "--draws", str(draws), *TINY, *extra]
    for candidate in candidates:
        argv += ["--candidate", *candidate]
    return main(argv)


def test_the_command_records_each_candidates_paired_draws_and_writes_the_chosen_config(table, tmp_path, capsys):
    out = tmp_path / "out"
    assert rehearse(table, out, "--json") == 0
    printed = capsys.readouterr().out
    answer = json.loads(printed.strip().splitlines()[-1])
    record = json.loads((out / "rehearsal.json").read_text())
    assert set(record["scores"]) == {BASE, "relaxed"} and all(set(by) == {"0", "1"} for by in record["scores"].values())
    pool = {name: [by[str(d)]["pool"] for d in range(2)] for name, by in record["scores"].items()}
    assert answer["choice"] == choose(pool) and [r["name"] for r in answer["rows"]] == [BASE, "relaxed"]
    gap = np.mean(np.subtract(pool["relaxed"], pool[BASE]))
    assert answer["rows"][1]["gap"] == pytest.approx(gap)
    assert "[draw 2/2] relaxed: pool" in printed and "| relaxed |" in (out / "rehearsal.md").read_text()
    assert (out / "draws.png").stat().st_size > 0
    best = load_yaml(out / "best.yaml")  # `ncdlr train --config best.yaml` takes it unchanged
    assert best.data.features == table and best.optim.epochs == 2
    assert (best.labeler.prior, best.labeler.reg_m) == (("uniform", 0.45) if answer["choice"] == "relaxed"
                                                        else ("adaptive", 0.0))


def test_a_rerun_resumes_and_more_draws_extend_without_training_a_recorded_draw_again(table, tmp_path, monkeypatch,
                                                                                      capsys):
    out = tmp_path / "out"
    assert rehearse(table, out) == 0
    first = json.loads((out / "rehearsal.json").read_text())["scores"]
    trained = []
    real = rehearsal.train

    def counting(cfg, splits):
        trained.append(cfg.labeler.prior)
        return real(cfg, splits)

    monkeypatch.setattr(rehearsal, "train", counting)
    assert rehearse(table, out, draws=3) == 0
    assert trained == ["adaptive", "uniform"]  # draw 2 only, each candidate once
    again = json.loads((out / "rehearsal.json").read_text())["scores"]
    assert all(again[name][d] == first[name][d] for name in first for d in first[name])  # draws 0, 1 kept
    assert "2 trainings to run, 4 recorded" in capsys.readouterr().out


def test_the_command_scores_what_the_benchmarks_rehearsal_scores_on_the_same_draws(table, tmp_path):
    """The command's planted pool scores equal :func:`ncdlr.service.rehearsal.select_edits` (the benchmark's
    rehearsal) on the same config and draws: one protocol, two front ends."""
    out = tmp_path / "out"
    assert rehearse(table, out) == 0
    record = json.loads((out / "rehearsal.json").read_text())["scores"]
    cfg = resolve(candidate_configs_settings(table))
    pool: dict = {}
    rehearsal.select_edits(single_process(cfg), read_feature_table(table, splits=("known", "novel")),
                           {BASE: {}, "relaxed": {"labeler.prior": "uniform", "labeler.reg_m": 0.45}}, BASE,
                           draws=2, pool=pool, planted=True)
    assert pool[BASE] == pytest.approx([record[BASE][d]["pool"] for d in ("0", "1")])
    assert pool["relaxed"] == pytest.approx([record["relaxed"][d]["pool"] for d in ("0", "1")])


def candidate_configs_settings(table):
    from ncdlr.service.config import override_settings
    from ncdlr.service.entry import feature_table_settings

    return feature_table_settings(table, None) + override_settings(TINY)


def test_a_record_made_with_another_config_for_a_name_is_refused_not_mixed(table, tmp_path, capsys):
    out = tmp_path / "out"
    assert rehearse(table, out) == 0
    assert rehearse(table, out, candidates=(["relaxed", "labeler.prior=uniform", "labeler.reg_m=0.2"],)) == 2
    err = capsys.readouterr().err
    assert "candidate 'relaxed' was rehearsed with another config (differs in labeler.reg_m)" in err
    assert rehearse(table, out, "--num-workers", "2") == 2  # the step's batch doubles: another training
    assert "differs in data.batch_size" in capsys.readouterr().err
    assert rehearse(table, out, "--problem", "known") == 2
    assert "choose another --output" in capsys.readouterr().err
    assert set(json.loads((out / "rehearsal.json").read_text())["scores"]["relaxed"]) == {"0", "1"}  # nothing lost


@pytest.mark.parametrize("candidate, message", [
    (["relaxed"], "candidate 'relaxed' has no key=value edit"),
    (["relaxed", "labeler.reg_m"], "expected key=value, got 'labeler.reg_m'"),
    (["config", "labeler.reg_m=0.45"], "the candidate name 'config' is the base config itself"),
    (["x", "labeler.no_such_key=1"], "unknown config key 'labeler.no_such_key'"),
    (["x", "labeler.reg_m=lots"], "labeler.reg_m"),
    (["same", "labeler.reg_m=0"], "resolves to the same config as 'config'"),
    (["reseeded", "run.seed=3"], "candidate 'reseeded' changes run.seed: the draws are paired by it"),
])
def test_a_malformed_candidate_is_refused_with_the_candidate_named(table, tmp_path, capsys, candidate, message):
    assert rehearse(table, tmp_path / "out", candidates=(candidate,)) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out" / "rehearsal.json").exists()


def test_no_candidate_too_few_draws_a_missing_table_and_negative_threads_are_refused(table, tmp_path, capsys):
    assert rehearse(table, tmp_path / "a", candidates=()) == 2
    assert "give at least one --candidate" in capsys.readouterr().err
    assert rehearse(table, tmp_path / "b", draws=1) == 2
    assert "at least 2 draws" in capsys.readouterr().err
    assert rehearse(str(tmp_path / "nope.parquet"), tmp_path / "c") == 2
    assert "nope.parquet" in capsys.readouterr().err
    assert rehearse(table, tmp_path / "d", "--threads", "-1") == 2
    assert "--threads must be 0" in capsys.readouterr().err


def test_two_candidates_with_one_name_are_refused():
    with pytest.raises(ConfigError, match="candidate 'a' is given twice"):
        candidate_configs([], [parse_candidate(["a", "labeler.reg_m=0.1"]), parse_candidate(["a", "labeler.reg_m=0.2"])])


def test_the_in_process_rehearsal_trains_with_the_whole_steps_batch():
    cfg = resolve([])
    cfg.data.batch_size, cfg.run.num_workers = 32, 2
    single = single_process(cfg)
    assert (single.data.batch_size, single.run.num_workers) == (64, 1) and cfg.data.batch_size == 32


def test_the_summary_pairs_each_candidate_with_the_base_draw_by_draw():
    plan = RehearsalPlan(draws=3)
    record = Record("t", {}, {}, {BASE: {str(d): {"pool": v, "val": 0.0} for d, v in enumerate([0.3, 0.5, 0.4])},
                                  "b": {str(d): {"pool": v, "val": 0.0} for d, v in enumerate([0.4, 0.5, 0.6])}})
    rows, choice = summarise(record, plan)
    assert choice == "b" and rows[1].won == 2 and rows[1].gap == pytest.approx(0.1)
    assert rows[1].se == pytest.approx(np.std([0.1, 0.0, 0.2], ddof=1) / np.sqrt(3))
    assert summarise(record, RehearsalPlan(draws=3, margin_se=2.0))[1] == BASE  # 0.1 < 2 · 0.058
    with pytest.raises(ValueError, match="no result for draws \\[3\\]"):
        summarise(record, RehearsalPlan(draws=4))


def test_an_unreadable_record_is_refused(tmp_path):
    path = tmp_path / "rehearsal.json"
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="is not a rehearsal record"):
        load_record(path, "t", RehearsalPlan(), {BASE: resolve([])})


def test_a_run_without_a_record_path_still_fills_the_record(table):
    configs = candidate_configs(candidate_configs_settings(table), [parse_candidate(RELAXED)])
    splits = read_feature_table(table, splits=("known", "novel"))
    plan = RehearsalPlan(draws=2)
    seen = []
    record = run_rehearsal(configs, splits, plan, Record.fresh(table, plan, configs),
                           progress=lambda d, n, r, done, total: seen.append((d, n, done, total)))
    assert seen == [(0, BASE, 1, 4), (0, "relaxed", 2, 4), (1, BASE, 3, 4), (1, "relaxed", 4, 4)]
    assert all(0.0 <= r["pool"] <= 1.0 for by in record.scores.values() for r in by.values())


def test_a_post_hoc_candidate_trains_with_the_base_once_per_draw_and_scores_its_own_fix(table, tmp_path, monkeypatch):
    """``--candidate la method.posthoc=la``: the base config and +LA train alike, so each draw trains once, and the
    two records differ only where the logit adjustment moves the pool's rows."""
    out, trained, real = tmp_path / "out", [], rehearsal.train

    def counting(cfg, splits):
        trained.append(cfg.method.posthoc)
        return real(cfg, splits)

    monkeypatch.setattr(rehearsal, "train", counting)
    assert rehearse(table, out, candidates=(["la", "method.posthoc=la"],)) == 0
    assert trained == ["none", "none"]  # draws 0 and 1, the base's training serving +LA too
    record = json.loads((out / "rehearsal.json").read_text())["scores"]
    assert set(record) == {BASE, "la"} and load_yaml(out / "best.yaml").method.posthoc in ("none", "la")
    assert all(0.0 <= record["la"][d]["pool"] <= 1.0 for d in ("0", "1"))
