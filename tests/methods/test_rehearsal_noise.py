"""benchmarks/rehearsal_noise.py and quality.py's replicated rehearsals, read from cache files written here (the
trainings themselves are the rehearsal's own: tests/tuning/test_rehearsal.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tests.fixtures.benchmarks import load_benchmark


def write_replicate(root, replicate: int, val: dict, pool: dict | None = None, what: str = "uniform-sizes"):
    quality = load_benchmark("quality")
    record = {"dataset": "synthetic", "key": what, "replicate": replicate, "draws": len(next(iter(val.values()))),
              "per_draw": val, "seconds": 10.0}
    if pool is not None:
        record["per_draw_pool"] = pool
    quality.selection_path(root, "synthetic", 2, what, replicate).write_text(json.dumps(record))


def test_replicates_are_averaged_draw_by_draw_before_the_choice_and_each_score_can_choose(tmp_path):
    quality = load_benchmark("quality")
    assert quality.selection_path(tmp_path, "d", None, "sizes", 0).name == "select-sizes-d.json"  # as before
    assert quality.selection_path(tmp_path, "d", 2, "sizes", 3).name == "select-sizes-r3-d-e2.json"
    # replicate 0 alone: +0.10, −0.06, +0.10 (no clear win); replicate 1 holds the second draw's noise the other way
    write_replicate(tmp_path, 0, {"held": [0.30, 0.40, 0.35], "uniform-relaxed": [0.40, 0.34, 0.45]},
                    {"held": [0.5, 0.5, 0.5], "uniform-relaxed": [0.5, 0.5, 0.5]})
    write_replicate(tmp_path, 1, {"held": [0.30, 0.36, 0.35], "uniform-relaxed": [0.40, 0.50, 0.45]},
                    {"held": [0.5, 0.5, 0.5], "uniform-relaxed": [0.5, 0.5, 0.5]})
    one = quality.setting_selection(tmp_path, "synthetic", None, 2, "uniform-sizes", 3)
    assert one["uniform-sizes"] == "held" and one["replicates"] == [0]
    both = quality.setting_selection(tmp_path, "synthetic", None, 2, "uniform-sizes", 3, replicates=(0, 1))
    assert both["uniform-sizes"] == "uniform-relaxed"
    assert both["per_draw"]["held"] == pytest.approx([0.30, 0.38, 0.35]) and both["seconds"] == 20.0
    pool = quality.setting_selection(tmp_path, "synthetic", None, 2, "uniform-sizes", 3, (0, 1), score="pool")
    assert pool["uniform-sizes"] == "held" and pool["score"] == "pool"
    with pytest.raises(SystemExit, match="holds 3 of 4 draws"):
        quality.setting_selection(tmp_path, "synthetic", None, 2, "uniform-sizes", 4)
    with pytest.raises(ValueError, match="score must be one of"):
        quality.setting_selection(tmp_path, "synthetic", None, 2, "uniform-sizes", 3, score="test")


def test_a_cache_from_before_the_pool_score_still_chooses_on_val_and_says_why_it_cannot_on_pool(tmp_path):
    quality = load_benchmark("quality")
    write_replicate(tmp_path, 0, {"held": [0.3, 0.4, 0.35], "uniform-relaxed": [0.4, 0.5, 0.46]})
    assert quality.setting_selection(tmp_path, "synthetic", None, 2, "uniform-sizes", 3)["uniform-sizes"] == \
        "uniform-relaxed"
    with pytest.raises(SystemExit, match="no pool scores"):
        quality.setting_selection(tmp_path, "synthetic", None, 2, "uniform-sizes", 3, score="pool")


def test_the_noise_parts_recover_the_seed_and_draw_spread_of_a_simulated_rehearsal():
    noise = load_benchmark("rehearsal_noise")
    rng = np.random.default_rng(0)
    draws, replicates = 400, 3
    true_gap = 0.02 + 0.08 * rng.standard_normal(draws)  # draw sd 8 points
    default = 0.5 + 0.05 * rng.standard_normal((replicates, draws))
    challenger = default + true_gap + 0.04 * rng.standard_normal((replicates, draws))  # seed sd 4 points
    seed_sd, draw_sd = noise.noise_parts(default, challenger)
    assert seed_sd == pytest.approx(4.0, rel=0.1) and draw_sd == pytest.approx(8.0, rel=0.1)
    gap = noise.paired_gap(default.mean(0), challenger.mean(0))
    assert gap.mean == pytest.approx(2.0, abs=1.0) and gap.se == pytest.approx(np.sqrt((64 + 16 / 3) / draws), rel=0.15)
    assert gap.chosen  # +2 points with an SE of about 0.4
    assert not noise.paired_gap(default[0, :3], default[0, :3] + [0.1, -0.1, 0.05]).chosen
    # 8 draws of sd 8 and seeds of sd 4: a 2-point gap needs 4 (64 + 16/R) / 4 draws — 80 at R = 1, 68 at R = 4
    assert noise.draws_needed(2.0, 4.0, 8.0, 1) == pytest.approx(80.0)
    assert noise.draws_needed(-2.0, 4.0, 8.0, 4) == pytest.approx(68.0) and noise.draws_needed(0, 4, 8, 1) == np.inf
    with pytest.raises(ValueError, match="R ≥ 2"):
        noise.noise_parts(default[:1], challenger[:1])


def test_the_report_prints_both_scores_for_each_replicate_set(tmp_path, capsys):
    noise = load_benchmark("rehearsal_noise")
    write_replicate(tmp_path, 0, {"held": [0.30, 0.40, 0.35], "uniform-relaxed": [0.40, 0.34, 0.45]},
                    {"held": [0.5, 0.6, 0.5], "uniform-relaxed": [0.6, 0.5, 0.6]})
    write_replicate(tmp_path, 1, {"held": [0.30, 0.36, 0.35], "uniform-relaxed": [0.40, 0.50, 0.45]},
                    {"held": [0.5, 0.6, 0.5], "uniform-relaxed": [0.6, 0.7, 0.6]})
    assert noise.main(["--datasets", "synthetic", "--draws", "3", "--replicates", "2", "--epochs", "2",
                       "--results", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "uniform-relaxed − held" in out and "[synthetic] (20 s of training)" in out
    # by hand: val gaps +10 −6 +10 and +10 +14 +10 (mean per draw +10 +4 +10); pool +10 −10 +10 and +10 +10 +10
    assert ("val   replicate 0: +4.7 (SE 5.3, 3 draws) | mean of 2: +8.0 (SE 2.0, 3 draws) → chosen | seed sd 8.2, "
            "draw sd 0.0 | per draw +10.0 +4.0 +10.0 | draws to resolve 8.0 at 2 SE with 1 / 3 / 10 replicates: "
            "4 / 1 / 0") in out
    assert "pool  replicate 0: +3.3 (SE 6.7, 3 draws) | mean of 2: +6.7 (SE 3.3, 3 draws) | seed sd 8.2" in out
    assert "correlation +1.00" in out
    with pytest.raises(SystemExit):
        noise.main(["--datasets", "synthetic", "--challenger", "held", "--results", str(tmp_path)])


def test_a_planted_rehearsal_runs_end_to_end_into_its_own_cache_and_the_report_reads_it(tmp_path, capsys):
    """``quality.py --select-problem planted``: the sizes rehearsal on planted problems (real trainings, 2 epochs,
    2 draws) is cached beside the known-class one under its own name, its pool score (the planted F1) chooses, and
    ``rehearsal_noise.py --problem planted`` reads it."""
    quality = load_benchmark("quality")
    threads = torch.get_num_threads()
    try:
        code = quality.main(["--datasets", "synthetic", "--seeds", "0", "--epochs", "2", "--select-setting",
                             "uniform-sizes", "--select-problem", "planted", "--select-score", "pool",
                             "--select-draws", "2", "--results", str(tmp_path)])
    finally:
        torch.set_num_threads(threads)
    assert code == 0 and "planted problem, pool score" in capsys.readouterr().out
    recorded = json.loads((tmp_path / "select-uniform-sizes-planted-synthetic-e2.json").read_text())
    assert recorded["problem"] == "planted" and recorded["pseudo_novel_fraction"] == quality.PLANTED_FRACTION
    assert not (tmp_path / "select-uniform-sizes-synthetic-e2.json").exists()
    for field in ("per_draw", "per_draw_pool"):
        assert all(len(v) == 2 and all(0 <= s <= 1 for s in v) for v in recorded[field].values())
    assert recorded["per_draw_pool"] != recorded["per_draw"]
    chosen = quality.setting_selection(tmp_path, "synthetic", None, 2, "uniform-sizes", 2, score="pool",
                                       problem="planted")
    assert chosen["problem"] == "planted" and chosen["uniform-sizes"] in ("held", "uniform-relaxed")
    with pytest.raises(ValueError, match="problem one of"):
        quality.setting_selection(tmp_path, "synthetic", None, 2, "uniform-sizes", 2, problem="alone")
    noise = load_benchmark("rehearsal_noise")
    assert noise.main(["--datasets", "synthetic", "--draws", "2", "--epochs", "2", "--problem", "planted",
                       "--results", str(tmp_path)]) == 0
    assert "(planted problem)" in capsys.readouterr().out
