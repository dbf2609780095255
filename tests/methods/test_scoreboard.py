"""benchmarks/scoreboard.py: the configs' standing against UNO and the paper's algorithm, on hand-made cells."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from ncdlr.service.config import load_config
from tests.fixtures.benchmarks import load_benchmark


def cell(pred: list[int], novel: float, known: float) -> dict:
    return {"test_pred": pred, "results": {"none": {"novel": novel, "known": known}}}


def test_the_goal_is_met_only_when_every_part_holds_and_each_failing_part_is_named():
    board = load_benchmark("scoreboard")
    assert board.goal_status(gap=6.0, se=2.0, known_config=60.0, known_uno=61.0, novel_std=1.5) == "met"
    assert board.goal_status(gap=4.0, se=1.0, known_config=60.0, known_uno=61.0, novel_std=1.5) == "gap +4.0 < 5"
    assert board.goal_status(gap=6.0, se=3.0, known_config=60.0, known_uno=61.0, novel_std=1.5) == "gap ≤ 2 SE (6.0)"
    assert board.goal_status(gap=6.0, se=1.0, known_config=57.0, known_uno=60.0, novel_std=2.5) == \
        "known -3.0 < -2; std 2.5 > 2"


def test_a_dataset_without_a_known_config_is_refused_by_name():
    board = load_benchmark("scoreboard")
    assert board.family("tabler-cached-p1") == "tabler" and board.family("openclipart-cached") == "openclipart"
    for name in ("synthetic", "openclipart", "cifar-cached"):
        with pytest.raises(ValueError, match=repr(name)):
            board.family(name)


@pytest.mark.parametrize("family", ["openclipart", "fashion", "emoji", "tabler", "phosphor", "mdi"])
def test_each_sets_config_variant_trains_what_its_shipped_config_sets(family):
    """The variant the scoreboard reads as "config" sets every method and labeler field the way the shipped config
    file does (the budget's fields aside: γ, which the uniform prior does not use, and the bound's filled-in value),
    so the table's "config" column is what `ncdlr train --config` runs."""
    board, quality = load_benchmark("scoreboard"), load_benchmark("quality")
    spec = board.CONFIG_OF[family]
    dataset = f"{family}-cached"
    cfg = quality.dataset_config(dataset, None)
    for section, values in quality.VARIANTS[spec["variant"]].items():
        for key, value in values.items():
            setattr(getattr(cfg, section), key, value)
    shipped = load_config(spec["config"])
    budget = {"gamma", "gamma_per_cluster", "max_imbalance"}
    for section in ("method", "labeler"):
        for field in dataclasses.fields(getattr(cfg, section)):
            if field.name in budget:
                continue
            assert getattr(getattr(cfg, section), field.name) == getattr(getattr(shipped, section), field.name), \
                f"{spec['variant']} and {spec['config']} differ in {section}.{field.name}"
    assert shipped.labeler.prior == "uniform"  # so the γ fields the check skips are unused by both


def two_seed_partition(board):
    """Known class 0; novel 1, 2 (two test images each). config right everywhere; UNO merges the novel classes
    (its per-seed gap +50); the paper's algorithm is right in seed 0 and merges in seed 1 (gaps 0, +50)."""
    y = np.array([0, 1, 1, 2, 2])
    right, merged = [0, 1, 1, 2, 2], [0, 1, 1, 1, 1]
    cells = {"config": {0: cell(right, 1.0, 0.70), 1: cell(right, 1.0, 0.74), 3: cell(right, 1.0, 0.5)},
             "uno": {0: cell(merged, 0.5, 0.71), 1: cell(merged, 0.5, 0.73)},
             "paper": {0: cell(right, 1.0, 0.6), 1: cell(merged, 0.5, 0.6)}}
    return board.partition("emoji-cached", y, 1, cells, draws=200)


def test_a_partition_pairs_the_seeds_all_three_arms_have_and_reads_both_gaps():
    board = load_benchmark("scoreboard")
    p = two_seed_partition(board)
    assert p.seeds == [0, 1]  # config's seed 3 has no partner
    assert p.vs_uno["gap"] == pytest.approx(50.0) and p.vs_uno["seed_se"] == pytest.approx(0.0)
    assert p.vs_paper["gap"] == pytest.approx(25.0) and p.vs_paper["seed_se"] == pytest.approx(25.0)
    assert p.novel["config"] == [100.0, 100.0] and p.known["config"] == pytest.approx([70.0, 74.0])
    assert p.to_known == {"config": [0.0, 0.0], "uno": [0.0, 0.0], "paper": [0.0, 0.0]}
    assert p.goal() == "met"
    assert board.partition("emoji-cached", np.array([0, 1]), 1, {"config": {0: {}}, "uno": {0: {}},
                                                                 "paper": {0: {}}}) is None


def test_the_table_pools_every_partition_each_set_and_the_sets_the_configs_were_not_chosen_on():
    board = load_benchmark("scoreboard")
    p = two_seed_partition(board)
    q = dataclasses.replace(p, dataset="fashion-cached", vs_uno={**p.vs_uno, "gap": 10.0, "total_se": 4.0})
    r = dataclasses.replace(p, dataset="emoji-cached-p1", vs_uno={**p.vs_uno, "gap": 0.0, "total_se": 3.0})
    pools = {label: uno for label, uno, _ in board.pools([p, q, r])}
    assert set(pools) == {"all 3 partitions", "emoji (2)", "sets the configs were chosen on (1)",
                          "sets they were not chosen on (2)"}
    assert pools["all 3 partitions"]["gap"] == pytest.approx(20.0)
    assert pools["emoji (2)"]["gap"] == pytest.approx(25.0)
    assert pools["sets they were not chosen on (2)"]["se"] == pytest.approx(
        np.hypot(p.vs_uno["total_se"], 3.0) / 2)
    text = board.render([p, q, r])
    row = next(line for line in text.splitlines() if line.startswith("| fashion-cached |"))
    assert "| ncdlr-uniform-relax-bound | 2 |" in row and "| +10.0 (4.0) |" in row and row.endswith("| met |")
    assert "| 100.0 ± 0.0 / 50.0 ± 0.0 / 75.0 ± 25.0 | 72.0 / 72.0 / 60.0 | 0.0 / 0.0 / 0.0 |" in row


def test_the_novel_to_known_share_counts_the_novel_test_images_in_a_known_column():
    """Known classes 0, 1; novel 2, 3 (four novel test images). UNO sends one novel image to a known column in seed 0
    and two in seed 1 (25 %, 50 %); the known image predicted as novel does not count."""
    board = load_benchmark("scoreboard")
    y = np.array([0, 1, 2, 2, 3, 3])
    right = [0, 1, 2, 2, 3, 3]
    cells = {"config": {0: cell([2, 1, 2, 2, 3, 3], 1.0, 0.5), 1: cell(right, 1.0, 1.0)},
             "uno": {0: cell([0, 1, 1, 2, 3, 3], 0.75, 1.0), 1: cell([0, 1, 0, 2, 3, 1], 0.5, 1.0)},
             "paper": {0: cell(right, 1.0, 1.0), 1: cell(right, 1.0, 1.0)}}
    p = board.partition("emoji-cached", y, 2, cells, draws=50)
    assert p.to_known == {"config": [0.0, 0.0], "uno": [25.0, 50.0], "paper": [0.0, 0.0]}
    assert "| 0.0 / 37.5 / 0.0 |" in board.render([p])


def test_the_command_reads_the_cells_prints_the_table_and_draws_the_plot(tmp_path, capsys):
    """A tiny feature table standing in for emoji-cached's (1 known, 2 novel classes) and the three arms' cells of
    two seeds under --results: the table has the partition's row; a partition with too few cells is named on
    stderr, not guessed."""
    from ncdlr.data.features import write_feature_table

    board, quality = load_benchmark("scoreboard"), load_benchmark("quality")
    labels = np.array([0, 0, 1, 1, 2, 2, 0, 1, 1, 2, 2])
    splits = ["known", "known", "novel", "novel", "novel", "novel"] + ["test"] * 5
    table = str(tmp_path / "table.parquet")
    write_feature_table(table, np.zeros((len(labels), 2)), labels, splits, num_known=1, num_novel=2)
    right, merged = [0, 1, 1, 2, 2], [0, 1, 1, 1, 1]
    for seed in (0, 1):
        for variant, pred, novel in (("ncdlr-uniform-relax-task-cb-bound", right, 1.0), ("uno", merged, 0.5),
                                     ("ncdlr", right, 1.0)):
            quality.cell_path(tmp_path, "emoji-cached", variant, seed, None, holdout_view=True).write_text(
                json.dumps(cell(pred, novel, 0.8)))
    quality.cell_path(tmp_path, "tabler-cached", "uno", 0, None, holdout_view=True).write_text(
        json.dumps(cell(right, 1.0, 0.8)))
    png = tmp_path / "board.png"
    assert board.main(["--datasets", "emoji-cached", "tabler-cached", "--seeds", "2", "--results", str(tmp_path),
                       "--holdout-view", "--table", f"emoji-cached={table}", "--table", f"tabler-cached={table}",
                       "--draws", "50", "--plot", str(png)]) == 0
    out, err = capsys.readouterr()
    row = next(line for line in out.splitlines() if line.startswith("| emoji-cached |"))
    assert "| +50.0 (0.0) | +0.0 (0.0) |" in row
    assert "tabler-cached (config 0, uno 1, paper 0 cells)" in err
    assert png.stat().st_size > 5000
