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
