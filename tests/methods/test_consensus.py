"""benchmarks/consensus.py: aligning, picking and voting over several seeds' runs, on hand-made cells whose answer is
known."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from tests.fixtures.benchmarks import load_benchmark


def test_alignment_recovers_a_renaming_of_the_clusters_without_labels():
    consensus = load_benchmark("consensus")
    rng = np.random.default_rng(0)
    reference = rng.integers(0, 6, size=300)
    renaming = np.array([3, 5, 0, 1, 4, 2])  # reference id -> other's id
    other = renaming[reference]
    other[:20] = rng.integers(0, 6, size=20)  # a little disagreement does not move the matching
    mapping = consensus.align_clusters(reference, other, 6)
    assert sorted(mapping) == list(range(6))
    assert (mapping[renaming] == np.arange(6)).all()
    assert consensus.aligned_agreement(reference, renaming[reference], 6) == 1.0
    assert consensus.aligned_agreement(reference, other, 6) == pytest.approx(np.mean(mapping[other] == reference))


def test_the_medoid_is_the_clustering_the_others_agree_with():
    consensus = load_benchmark("consensus")
    truth = np.repeat(np.arange(4), 25)
    merged = truth.copy()
    merged[merged == 3] = 2  # classes 2 and 3 in one cluster, cluster 3 taken by half of class 0
    merged[:12] = 3
    renamed = (truth + 1) % 4  # the true partition under other names
    noisy = truth.copy()
    noisy[::9] = (noisy[::9] + 1) % 4
    runs = np.stack([merged, renamed, noisy])
    assert consensus.medoid(runs) == 1  # agrees exactly with `noisy`'s partition up to its noise, `merged` less
    assert consensus.medoid(np.stack([truth, truth])) == 0  # the first of equals


def test_the_vote_renames_each_runs_novel_columns_and_keeps_the_known_ones():
    """Ks = 2 known columns, Ku = 3 novel. Three runs cluster the novel training rows the same way under three
    namings; on the test images each makes its own few mistakes, which the other two outvote."""
    consensus = load_benchmark("consensus")
    num_known, num_novel = 2, 3
    train_truth = np.repeat(np.arange(num_novel), 10)
    namings = [np.array([0, 1, 2]), np.array([2, 0, 1]), np.array([1, 2, 0])]  # true cluster -> run's id
    novel_train = np.stack([n[train_truth] for n in namings])
    y_test = np.array([0, 0, 1, 1, 2, 2, 3, 3, 4, 4])  # classes 2..4 novel
    preds = []
    for run, naming in enumerate(namings):
        pred = np.where(y_test < num_known, y_test, num_known + naming[np.maximum(y_test - num_known, 0)])
        pred[2 * run] = 1 - y_test[2 * run] if y_test[2 * run] < num_known else num_known  # one mistake per run
        preds.append(pred)
    voted = consensus.vote(np.stack(preds), novel_train, num_known, num_novel)
    ref = consensus.medoid(novel_train)
    expected = np.where(y_test < num_known, y_test, num_known + namings[ref][np.maximum(y_test - num_known, 0)])
    assert (voted == expected).all()
    # a three-way disagreement is a tie: the medoid's own prediction stands (the namings agree, so run 0 is it)
    assert ref == 0
    tied = np.stack(preds)
    tied[:, 0] = [1, 0, num_known + namings[2][0]]  # known 1, known 0, a novel cluster
    assert consensus.vote(tied, novel_train, num_known, num_novel)[0] == 1


def test_jackknife_over_seeds_of_a_mean_over_seed_subsets():
    consensus = load_benchmark("consensus")
    seeds = list(range(6))
    subsets = list(itertools.combinations(seeds, 3))
    assert consensus.jackknife_se(np.full(len(subsets), 4.0), subsets, seeds) == 0.0
    # a value that is the mean of its seeds' effects: the jackknife of the subset mean is that of the plain mean
    effect = np.array([1.0, 3.0, -2.0, 0.5, 4.0, -1.0])
    values = np.array([effect[list(s)].mean() for s in subsets])
    plain = effect.std(ddof=1) / np.sqrt(len(effect))
    assert consensus.jackknife_se(values, subsets, seeds) == pytest.approx(plain, rel=0.25)
    assert np.isnan(consensus.jackknife_se(np.ones(1), [(0, 1)], [0, 1]))


def test_consensus_over_subsets_scores_single_runs_pick_and_vote():
    """Four seeds on Ks = 1, Ku = 2: three runs separate the novel classes (under different names), one merges them.
    Every 3-subset's vote and pick separate them; the members' mean carries the merging run when it is drawn."""
    consensus = load_benchmark("consensus")
    y_test = np.array([0, 0, 1, 1, 1, 2, 2, 2])
    train_truth = np.array([0] * 6 + [1] * 6)
    good = [(y_test, train_truth), (np.where(y_test == 0, 0, 3 - y_test), 1 - train_truth), (y_test, train_truth)]
    merged = (np.where(y_test == 0, 0, 1), np.zeros(12, dtype=np.int64))
    cells = {s: {"test_pred": p.tolist(), "novel_train_pred": t.tolist()} for s, (p, t) in enumerate(good + [merged])}
    c = consensus.consensus(y_test, 1, 2, cells, 3)
    assert c.single[0] == c.single[1] == 100.0 and c.single[3] == 50.0
    assert len(c.subsets) == 4 and (c.vote == 100.0).all() and (c.pick == 100.0).all()
    with_merged = np.array([3 in s for s in c.subsets])
    assert c.members[with_merged] == pytest.approx(250 / 3) and (c.members[~with_merged] == 100.0).all()
    with pytest.raises(ValueError, match="size"):
        consensus.consensus(y_test, 1, 2, cells, 5)


def test_the_command_prints_each_variant_and_the_fair_gap_from_the_cells(tmp_path, capsys):
    """A tiny table (1 known class, 2 novel; two novel training rows per class) and three seeds of two variants.
    `ncdlr` separates the novel classes in every seed (under a different naming in seed 1); `uno` merges them in
    seeds 1 and 2. With M = 2 every pair is scored; the gap is vote(ncdlr) − vote(uno) on the same pairs."""
    from tests.methods.test_seed_spread import command_on_a_tiny_table

    consensus, quality = load_benchmark("consensus"), load_benchmark("quality")
    argv = command_on_a_tiny_table(tmp_path, [0, 0, 1, 1, 2, 2], [0, 1, 1, 2, 2], num_known=1)
    argv[argv.index("--seeds") + 1] = "3"
    apart = {"test_pred": [0, 1, 1, 2, 2], "novel_train_pred": [0, 0, 1, 1]}
    renamed = {"test_pred": [0, 2, 2, 1, 1], "novel_train_pred": [1, 1, 0, 0]}
    merged = {"test_pred": [0, 1, 1, 1, 1], "novel_train_pred": [0, 0, 0, 0]}
    for seed, (ncdlr, uno) in enumerate([(apart, apart), (renamed, merged), (apart, merged)]):
        quality.cell_path(tmp_path, "fashion-cached", "ncdlr", seed, None).write_text(json.dumps(ncdlr))
        quality.cell_path(tmp_path, "fashion-cached", "uno", seed, None).write_text(json.dumps(uno))
    assert consensus.main([*argv, "--variants", "ncdlr", "uno", "--size", "2", "--gap", "ncdlr", "uno"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[2] == ("| fashion-cached | ncdlr | 3 | 1.00 | 2 (3) | 100.0 ± 0.0 | 100.0 ± 0.0 | 100.0 ± 0.0 "
                      "| +0.0 (0.0) |")
    assert out[3].startswith("| fashion-cached | uno | 3 | 0.67 | 2 (3) | 66.7 ± 23.6 |")  # pairs: ½, ½, 1
    gap = [line for line in out if line.startswith("| fashion-cached | +")]
    assert len(gap) == 1 and gap[0].endswith("| +33.3 | 3 |")
    assert consensus.main([*argv, "--variants", "ncdlr", "--size", "3"]) == 0
    assert "needs more than M seeds" in capsys.readouterr().out


def hand_cell(novel: float, known: float, train_novel: float, view0: list[int], heldout: list[int] | None) -> dict:
    """A quality.py cell with only what :func:`restart_pick` reads (accuracies as fractions, as the cells keep them)."""
    cell = {"results": {"none": {"novel": novel, "known": known}}, "novel_train": {"all": train_novel},
            "novel_train_pred": view0}
    if heldout is not None:
        cell["novel_heldout_pred"] = heldout
    return cell


def test_heldout_agreement_is_the_share_of_rows_whose_unseen_crop_keeps_its_cluster():
    consensus = load_benchmark("consensus")
    assert consensus.heldout_agreement(hand_cell(0, 0, 0, [0, 0, 1, 1], [0, 1, 1, 1])) == 0.75
    assert consensus.heldout_agreement(hand_cell(0, 0, 0, [2, 0, 1], [2, 0, 1])) == 1.0
    assert np.isnan(consensus.heldout_agreement(hand_cell(0, 0, 0, [0, 1], None)))


def test_the_restart_pick_keeps_each_subsets_most_view_consistent_run():
    """Four seeds: two runs whose unseen crops keep their clusters (agreement 1.0 and 0.9) and score well, two that
    cross a boundary more often (0.6, 0.5) and score badly. Every 2-subset keeps its higher-agreement run; the
    pick − members gain is what the choice adds over drawing a run at random."""
    consensus = load_benchmark("consensus")
    view0 = [0] * 5 + [1] * 5
    heldout = {1.0: view0, 0.9: [1] + view0[1:], 0.6: [1, 1, 1, 1] + view0[4:], 0.5: [1] * 10}
    plan = {0: (0.6, 0.30, 0.62), 1: (1.0, 0.40, 0.60), 2: (0.5, 0.28, 0.66), 3: (0.9, 0.38, 0.61)}
    cells = {s: hand_cell(novel, known, novel, view0, heldout[a]) for s, (a, novel, known) in plan.items()}
    r = consensus.restart_pick(cells, 2)
    assert r.score == {0: 0.6, 1: 1.0, 2: 0.5, 3: 0.9}
    picked = {sub: novel for sub, novel in zip(r.subsets, r.pick_novel)}
    assert picked == pytest.approx({(0, 1): 40.0, (0, 2): 30.0, (0, 3): 38.0, (1, 2): 40.0, (1, 3): 40.0,
                                    (2, 3): 38.0})
    assert r.pick_known[r.subsets.index((0, 2))] == pytest.approx(62.0)
    assert r.members == pytest.approx([35.0, 29.0, 34.0, 34.0, 39.0, 33.0])
    assert consensus.rank_correlation(r.score, r.novel) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="holdout-view"):
        consensus.restart_pick({**cells, 4: hand_cell(0.3, 0.6, 0.3, view0, None)}, 2)
    with pytest.raises(ValueError, match="size"):
        consensus.restart_pick(cells, 5)


def test_the_command_prints_the_restart_pick_table_and_the_per_seed_readings(tmp_path, capsys):
    """Three `--holdout-view` cells on a tiny table: the run whose held-out crops keep their clusters separates the
    novel classes; the other two merge them. `--restart-score` picks the first in every pair that holds it."""
    from tests.methods.test_seed_spread import command_on_a_tiny_table

    consensus, quality = load_benchmark("consensus"), load_benchmark("quality")
    argv = command_on_a_tiny_table(tmp_path, [0, 0, 1, 1, 2, 2], [0, 1, 1, 2, 2], num_known=1)
    argv[argv.index("--seeds") + 1] = "3"
    apart = {**hand_cell(1.0, 1.0, 1.0, [0, 0, 1, 1], [0, 0, 1, 1]), "test_pred": [0, 1, 1, 2, 2]}
    merged = {**hand_cell(0.5, 1.0, 0.5, [0, 0, 0, 0], [0, 1, 0, 1]), "test_pred": [0, 1, 1, 1, 1]}
    for seed, cell in enumerate([merged, apart, merged]):
        quality.cell_path(tmp_path, "fashion-cached", "ncdlr", seed, None, holdout_view=True).write_text(
            json.dumps(cell))
        quality.cell_path(tmp_path, "fashion-cached", "uno", seed, None, holdout_view=True).write_text(
            json.dumps({**merged, "results": {"none": {"novel": 0.5, "known": 0.9}}}))
    assert consensus.main([*argv, "--holdout-view", "--size", "2", "--restart-score", "--gap", "ncdlr", "uno"]) == 0
    out = capsys.readouterr().out.splitlines()
    # each method's own pick on the same pairs: ncdlr 100, 50, 100 against uno's 50 everywhere; known 100 − 90
    assert out[-1].startswith("| fashion-cached | +33.3 (") and out[-1].endswith("| +10.0 (0.0) | +16.7 | 3 |")
    table = [line for line in out if line.startswith("| fashion-cached | ncdlr | 3 | 0.500–1.000")]
    assert len(table) == 1
    # pairs (0,1), (0,2), (1,2): picks 100, 50, 100 against members 75, 50, 75
    assert "| 2 (3) | 66.7 ± 23.6 | 83.3 ± 23.6 | +16.7 (" in table[0] and table[0].endswith("| +0.0 (0.0) |")
    assert "| fashion-cached | ncdlr | 1 | 1.000 | 100.0 | 100.0 | 100.0 |" in out
    assert consensus.main([*argv, "--holdout-view", "--size", "2"]) == 0
    assert "held-out agreement" not in capsys.readouterr().out
