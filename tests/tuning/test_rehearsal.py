"""ncdlr.service.rehearsal.select_gamma: the in-process γ rehearsal on the search's own validation protocol."""

from __future__ import annotations

import pytest
import torch

from ncdlr.data.features import FeatureSplits
from ncdlr.service import rehearsal
from ncdlr.service.config import Config
from ncdlr.service.local import embed
from ncdlr.service.validation import (SCORING_SPLIT, ValidationConfig, planted_scores, planted_splits,
                                     validation_splits)

KS, KU, DIM = 6, 4, 16


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def unlabeled_novel_table(seed: int = 0) -> FeatureSplits:
    """Gaussian clusters around orthogonal centres, long-tailed known classes, and 300 novel rows of Ku = 4
    classes *without labels* (the rehearsal may count them, never read their labels)."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.cat([torch.full((n,), c) for c, n in enumerate([120, 80, 60, 40, 30, 20])])
    x = 3.0 * torch.eye(DIM)[labels] + 0.6 * torch.randn(len(labels), DIM, generator=g)
    novel = 3.0 * torch.eye(DIM)[KS + torch.arange(300) % KU] + 0.6 * torch.randn(300, DIM, generator=g)
    return FeatureSplits({"known": x, "novel": novel}, {"known": labels}, KS, KU, [str(i) for i in range(KS + KU)])


def tiny_config() -> Config:
    cfg = Config()
    cfg.model.head, cfg.model.head_dim = "linear", 16
    cfg.data.batch_size, cfg.data.feature_noise = 32, 0.1
    cfg.optim.epochs, cfg.optim.lr, cfg.optim.min_lr, cfg.optim.warmup_epochs = 2, 1e-2, 1e-3, 1
    cfg.labeler.buffer_size, cfg.labeler.outer_steps = 256, 5
    return cfg


def test_select_gamma_trains_each_candidate_on_the_search_validation_split_at_equal_gamma_per_cluster(monkeypatch):
    splits, cfg = unlabeled_novel_table(), tiny_config()
    expected, info = validation_splits(splits, ValidationConfig(seed=cfg.run.seed))
    seen = []

    def spy(trial_cfg, trained_on):
        seen.append((trial_cfg.labeler.gamma, trained_on))
        return real_train(trial_cfg, trained_on)

    real_train = rehearsal.train
    monkeypatch.setattr(rehearsal, "train", spy)
    gamma, scores = rehearsal.select_gamma(cfg, splits, gamma_per_cluster=(0.1, 1.0))

    assert [g for g, _ in seen] == pytest.approx([0.1 * info.num_novel, 1.0 * info.num_novel])
    assert len(set(map(id, (t for _, t in seen)))) == 1  # the validation problem is built once
    for _, trained_on in seen:  # the protocol of ncdlr.service.validation: pseudo-novel classes, held-out val
        assert (trained_on.num_known, trained_on.num_novel) == (expected.num_known, expected.num_novel)
        for split in ("known", "novel", SCORING_SPLIT):
            assert torch.equal(trained_on.features[split], expected.features[split])
            assert torch.equal(trained_on.labels[split], expected.labels[split])
    assert set(scores) == {0.1, 1.0} and all(0.0 <= v <= 1.0 for v in scores.values())
    assert gamma in (0.1 * KU, 1.0 * KU)  # rescaled to the real Ku, not the validation problem's Ku'


def test_a_candidate_trains_as_many_steps_per_epoch_as_the_real_run():
    cfg = tiny_config()
    trial = rehearsal.apply_gamma(rehearsal.scaled_config(cfg, scale=0.25), 3.0)
    assert (trial.labeler.gamma, trial.data.batch_size, trial.labeler.buffer_size) == (3.0, 8, 64)
    assert (cfg.data.batch_size, cfg.labeler.buffer_size) == (32, 256)  # the run's own config is left alone
    tiny = rehearsal.scaled_config(cfg, scale=0.001)
    assert tiny.data.batch_size == 1 and tiny.labeler.buffer_size == 1


def test_the_winner_is_the_best_scored_candidate_and_ties_go_to_half_a_cluster(monkeypatch):
    splits, cfg = unlabeled_novel_table(), tiny_config()
    monkeypatch.setattr(rehearsal, "train", lambda trial_cfg, _: trial_cfg.labeler.gamma)
    by_gamma = {}
    monkeypatch.setattr(rehearsal, "rehearsal_score", lambda gamma, *_, **__: by_gamma[gamma])
    _, info = validation_splits(splits, ValidationConfig(seed=cfg.run.seed))
    by_gamma.update({0.05 * info.num_novel: 0.2, 0.5 * info.num_novel: 0.6, 1.5 * info.num_novel: 0.6})
    gamma, scores = rehearsal.select_gamma(cfg, splits, gamma_per_cluster=(0.05, 0.5, 1.5))
    assert scores == {0.05: 0.2, 0.5: 0.6, 1.5: 0.6} and gamma == pytest.approx(0.5 * KU)


def test_the_uniform_candidate_trains_with_the_uniform_prior_and_wins_as_uniform(monkeypatch):
    splits, cfg = unlabeled_novel_table(), tiny_config()
    priors = []

    def fake_train(trial_cfg, _):
        priors.append((trial_cfg.labeler.prior, trial_cfg.labeler.gamma))
        return trial_cfg.labeler.prior

    monkeypatch.setattr(rehearsal, "train", fake_train)
    monkeypatch.setattr(rehearsal, "rehearsal_score", lambda prior, *_, **__: 0.9 if prior == "uniform" else 0.3)
    gamma, scores = rehearsal.select_gamma(cfg, splits, gamma_per_cluster=(rehearsal.UNIFORM, 0.5))
    assert priors[0] == ("uniform", cfg.labeler.gamma) and priors[1][0] == "adaptive"
    assert gamma == rehearsal.UNIFORM and scores == {rehearsal.UNIFORM: 0.9, 0.5: 0.3}
    chosen = rehearsal.apply_gamma(tiny_config(), gamma)
    assert chosen.labeler.prior == "uniform"
    assert rehearsal.apply_gamma(tiny_config(), 2.5).labeler.gamma == 2.5


def test_draws_average_scores_over_other_pseudo_novel_classes_and_held_out_images(monkeypatch):
    splits, cfg = unlabeled_novel_table(), tiny_config()
    problems = []

    def fake_train(trial_cfg, trained_on):
        problems.append(trained_on)
        return len(problems)

    monkeypatch.setattr(rehearsal, "train", fake_train)
    monkeypatch.setattr(rehearsal, "rehearsal_score", lambda n, *_, **__: float(n))  # 1, 2, 3, 4 in call order
    per_draw = {}
    gamma, scores = rehearsal.select_gamma(cfg, splits, gamma_per_cluster=(0.5, 1.5), draws=2,
                                           pseudo_novel_fraction=0.5, per_draw=per_draw)
    assert per_draw == {0.5: [1.0, 3.0], 1.5: [2.0, 4.0]} and scores == {0.5: 2.0, 1.5: 3.0}
    first, second = problems[0], problems[2]
    for seed, problem in ((0, first), (1, second)):
        expected, _ = validation_splits(splits, ValidationConfig(seed=cfg.run.seed + seed, pseudo_novel_fraction=0.5))
        assert torch.equal(problem.labels[SCORING_SPLIT], expected.labels[SCORING_SPLIT])
        assert problem.num_novel == expected.num_novel == 3  # half of Ks = 6
    assert not torch.equal(first.features["novel"], second.features["novel"]) or \
        not torch.equal(first.labels[SCORING_SPLIT], second.labels[SCORING_SPLIT])
    with pytest.raises(ValueError, match="draws"):
        rehearsal.select_gamma(cfg, splits, draws=0)


def test_with_several_draws_the_default_stays_unless_a_candidate_beats_it_draw_by_draw():
    # OpenClipart-LT's rehearsal (3 draws): 0.15 has the best mean, but not on every draw: noise, keep 0.5
    measured = {rehearsal.UNIFORM: [0.316, 0.453, 0.366], 0.15: [0.389, 0.396, 0.394], 0.5: [0.303, 0.413, 0.399],
                1.5: [0.339, 0.499, 0.272]}
    assert rehearsal.choose_candidate(measured) == 0.5
    assert rehearsal.choose_candidate(measured, default=None) == 0.15  # a plain argmax would take it
    clear = {0.5: [0.30, 0.40, 0.35], 1.5: [0.40, 0.51, 0.44], rehearsal.UNIFORM: [0.35, 0.46, 0.40]}
    assert rehearsal.choose_candidate(clear) == 1.5  # +0.10 on every draw; the uniform's +0.05 clears too, less
    assert rehearsal.choose_candidate(clear, margin_se=100.0) == 0.5
    assert rehearsal.choose_candidate({0.5: [0.3], 1.5: [0.4]}) == 1.5  # one draw: the best score


def test_select_setting_rehearses_a_config_key_on_scaled_trials_and_keeps_the_default_without_evidence(monkeypatch):
    splits, cfg = unlabeled_novel_table(), tiny_config()
    trials = []

    def fake_train(trial_cfg, trained_on):
        trials.append((trial_cfg.optim.known_warmup_epochs, trial_cfg.data.batch_size, trained_on.num_novel))
        return trial_cfg.optim.known_warmup_epochs

    scores = {0.0: iter([0.30, 0.40, 0.35]), 1.0: iter([0.32, 0.38, 0.37])}  # +0.02, −0.02, +0.02: noise
    monkeypatch.setattr(rehearsal, "train", fake_train)
    monkeypatch.setattr(rehearsal, "rehearsal_score", lambda value, *_, **__: next(scores[value]))
    per_draw = {}
    value, means = rehearsal.select_setting(cfg, splits, "optim.known_warmup_epochs", (0.0, 1.0), default=0.0,
                                            draws=3, pseudo_novel_fraction=0.5, per_draw=per_draw)
    assert value == 0.0 and means == pytest.approx({0.0: 0.35, 1.0: 0.3567}, abs=1e-4)
    assert per_draw == {0.0: [0.30, 0.40, 0.35], 1.0: [0.32, 0.38, 0.37]}
    assert [t[0] for t in trials] == [0.0, 1.0] * 3 and {t[2] for t in trials} == {3}
    assert all(t[1] < cfg.data.batch_size for t in trials) and cfg.optim.known_warmup_epochs == 0.0  # scaled copies
    scores = {0.0: iter([0.30, 0.40, 0.35]), 1.0: iter([0.40, 0.49, 0.46])}  # +0.10 on every draw
    assert rehearsal.select_setting(cfg, splits, "optim.known_warmup_epochs", (0.0, 1.0), 0.0)[0] == 1.0
    with pytest.raises(ValueError, match="unknown config key"):
        rehearsal.select_setting(cfg, splits, "optim.no_such_key", (0, 1), 0)
    with pytest.raises(ValueError, match="at least 2 draws"):
        rehearsal.select_setting(cfg, splits, "optim.known_warmup_epochs", (0.0, 1.0), 0.0, draws=1)


def test_select_edits_rehearses_named_edits_of_several_keys_and_keeps_the_default_without_evidence(monkeypatch):
    splits, cfg = unlabeled_novel_table(), tiny_config()
    trials = []

    def fake_train(trial_cfg, trained_on):
        trials.append((trial_cfg.labeler.prior, trial_cfg.labeler.reg_m))
        return (trial_cfg.labeler.prior, trial_cfg.labeler.reg_m)

    candidates = {"held": {}, "relaxed": {"labeler.reg_m": 0.45},
                  "uniform-relaxed": {"labeler.prior": "uniform", "labeler.reg_m": 0.45}}
    measured = {("adaptive", 0.0): [0.30, 0.40, 0.35], ("adaptive", 0.45): [0.33, 0.37, 0.38],  # noise around held
                ("uniform", 0.45): [0.40, 0.49, 0.46]}  # +0.10 on every draw
    scores = {k: iter(v) for k, v in measured.items()}
    monkeypatch.setattr(rehearsal, "train", fake_train)
    monkeypatch.setattr(rehearsal, "rehearsal_score", lambda edit, *_, **__: next(scores[edit]))
    per_draw = {}
    name, means = rehearsal.select_edits(cfg, splits, candidates, "held", draws=3, pseudo_novel_fraction=0.5,
                                         per_draw=per_draw)
    assert name == "uniform-relaxed" and means["held"] == pytest.approx(0.35)
    assert per_draw == {"held": measured[("adaptive", 0.0)], "relaxed": measured[("adaptive", 0.45)],
                        "uniform-relaxed": measured[("uniform", 0.45)]}
    assert trials == [("adaptive", 0.0), ("adaptive", 0.45), ("uniform", 0.45)] * 3  # each draw: every candidate
    assert cfg.labeler.prior == "adaptive" and cfg.labeler.reg_m == 0.0  # the edits went to copies
    scores = {k: iter(v) for k, v in measured.items()}
    scores[("uniform", 0.45)] = iter([0.31, 0.38, 0.36])  # no clear win now: the default stays
    assert rehearsal.select_edits(cfg, splits, candidates, "held", draws=3, pseudo_novel_fraction=0.5)[0] == "held"
    with pytest.raises(ValueError, match="unknown config key 'labeler.no_such_key'"):
        rehearsal.select_edits(cfg, splits, {"held": {}, "x": {"labeler.no_such_key": 1}}, "held")
    with pytest.raises(ValueError, match="default among the candidates"):
        rehearsal.select_edits(cfg, splits, candidates, "uniform")


def test_later_draws_extend_an_earlier_rehearsal_with_the_same_validation_problems(monkeypatch):
    """``first_draw``: draws 2 and 3 run alone are the problems draws 2 and 3 of a four-draw rehearsal trained on,
    so a cached rehearsal grows by its missing draws (``quality.py --select-draws``) instead of running again."""
    splits, cfg = unlabeled_novel_table(), tiny_config()
    problems = []
    monkeypatch.setattr(rehearsal, "train", lambda trial_cfg, trained_on: problems.append(trained_on) or trained_on)
    monkeypatch.setattr(rehearsal, "rehearsal_score", lambda problem, *_, **__: float(problem.labels[SCORING_SPLIT].sum()))
    edit = {"only": lambda trial, ku: None}
    whole = rehearsal.rehearse(cfg, splits, edit, draws=4, pseudo_novel_fraction=0.5)["only"]
    later = rehearsal.rehearse(cfg, splits, edit, draws=2, pseudo_novel_fraction=0.5, first_draw=2)["only"]
    assert later == whole[2:] and len(set(whole)) > 1  # the draws differ; the later ones are the same problems
    assert torch.equal(problems[-1].labels[SCORING_SPLIT], problems[3].labels[SCORING_SPLIT])
    with pytest.raises(ValueError, match="first_draw"):
        rehearsal.rehearse(cfg, splits, edit, draws=1, first_draw=-1)


def test_a_replicate_trains_the_same_problems_with_other_seeds_and_the_pool_scores_the_rows_each_run_clustered(
        monkeypatch):
    """Replicate ``r`` of a rehearsal: the same validation draws, the training seed ``run.seed + 1000 r``; the pool
    score of each run is read on the pseudo-novel rows it trained on (their labels only score, never train)."""
    splits, cfg = unlabeled_novel_table(), tiny_config()
    trained, scored = [], []
    monkeypatch.setattr(rehearsal, "train", lambda trial_cfg, trained_on: trained.append(
        (trial_cfg.run.seed, trained_on)) or trial_cfg.run.seed)

    def fake_score(run, problem, split=SCORING_SPLIT, cfg=None):  # the run (its seed), and how many rows the split has
        scored.append((run, split))
        return len(problem.labels[split]) / 1000

    monkeypatch.setattr(rehearsal, "rehearsal_score", fake_score)
    edits = {"held": lambda trial, ku: None}
    pool = {}
    first = rehearsal.rehearse(cfg, splits, edits, draws=2, pseudo_novel_fraction=0.5)
    again = rehearsal.rehearse(cfg, splits, edits, draws=2, pseudo_novel_fraction=0.5, replicate=2, pool=pool)
    assert [seed for seed, _ in trained] == [0, 0, 2000, 2000]
    for (_, a), (_, b) in ((trained[0], trained[2]), (trained[1], trained[3])):  # draw d: one problem, both replicates
        for split in ("known", "novel", SCORING_SPLIT):
            assert torch.equal(a.features[split], b.features[split]) and torch.equal(a.labels[split], b.labels[split])
    assert first == again and first["held"] == [len(p.labels[SCORING_SPLIT]) / 1000 for _, p in trained[:2]]
    assert pool == {"held": [len(p.labels[rehearsal.POOL_SPLIT]) / 1000 for _, p in trained[2:]]}
    assert pool["held"] != again["held"]  # the pool is the pseudo-novel training rows, not the held-out ones
    assert scored == [(0, SCORING_SPLIT)] * 2 + [(2000, SCORING_SPLIT), (2000, rehearsal.POOL_SPLIT)] * 2
    assert rehearsal.replicate_seed(cfg, 0) == cfg.run.seed
    with pytest.raises(ValueError, match="replicate must be at least 0"):
        rehearsal.replicate_seed(cfg, -1)


def test_the_pool_score_reads_a_trained_run_on_the_pseudo_novel_rows(one_torch_thread):
    """The real score on the real split: a trained run's class-mean accuracy over the pseudo-novel classes."""
    splits, cfg = unlabeled_novel_table(), tiny_config()
    problem, info = validation_splits(splits, ValidationConfig(seed=0, pseudo_novel_fraction=0.5))
    run = rehearsal.train(cfg, problem)
    pool = rehearsal.rehearsal_score(run, problem, rehearsal.POOL_SPLIT)
    assert 0.0 <= pool <= 1.0 and len(problem.labels[rehearsal.POOL_SPLIT]) > len(problem.labels[SCORING_SPLIT]) / 2
    assert set(problem.labels[rehearsal.POOL_SPLIT].tolist()) == set(range(info.num_known,
                                                                           info.num_known + info.num_novel))


def test_a_planted_rehearsal_trains_on_the_real_pool_and_scores_the_planted_classes_f1(monkeypatch):
    """``planted=True``: draw d is the planted problem of seed ``run.seed + d`` (the real novel rows beside the
    pseudo-novel ones, no batch scaling since the pool is larger than the real one), candidates see Ku' + Ku
    clusters, and ``pool`` is filled with :func:`~ncdlr.service.rehearsal.planted_score` of each run."""
    splits, cfg = unlabeled_novel_table(), tiny_config()
    trained, kus = [], []
    monkeypatch.setattr(rehearsal, "train", lambda trial_cfg, trained_on: trained.append(
        (trial_cfg.data.batch_size, trained_on)) or "run")
    monkeypatch.setattr(rehearsal, "rehearsal_score", lambda run, problem, split=SCORING_SPLIT, cfg=None: 0.25)
    monkeypatch.setattr(rehearsal, "planted_score", lambda run, problem, info, cfg=None: info.num_novel / 100)
    pool = {}
    scores = rehearsal.rehearse(cfg, splits, {"only": lambda trial, ku: kus.append(ku)}, draws=2,
                                pseudo_novel_fraction=0.5, pool=pool, planted=True)
    assert scores == {"only": [0.25, 0.25]}
    for draw, (batch, problem) in enumerate(trained):
        expected, info = planted_splits(splits, ValidationConfig(seed=cfg.run.seed + draw, pseudo_novel_fraction=0.5))
        assert batch == cfg.data.batch_size and problem.num_novel == info.num_novel + KU == kus[draw]
        assert torch.equal(problem.features["novel"], expected.features["novel"])
        assert pool["only"][draw] == info.num_novel / 100


def test_the_planted_score_reads_a_trained_run_on_the_whole_pool(one_torch_thread):
    """The real score on a real run: the planted classes' F1 against the run's clusters of every novel row."""
    splits, cfg = unlabeled_novel_table(), tiny_config()
    problem, info = planted_splits(splits, ValidationConfig(seed=0, pseudo_novel_fraction=0.5))
    run = rehearsal.train(cfg, problem)
    logits = run.method.predict_logits(run.model, embed(run.model, problem.features["novel"]))
    assert logits.shape[1] == problem.num_known + problem.num_novel == KS + KU
    score = rehearsal.planted_score(run, problem, info)
    assert 0.0 < score <= 1.0
    assert score == planted_scores(problem.labels["novel"].numpy(), logits.argmax(1).numpy(), info)["score"]


def test_a_post_hoc_candidate_shares_its_draws_training_and_is_scored_after_its_fix(monkeypatch):
    """``method.posthoc`` changes only how a trained model is scored: a rehearsal of the plain predictions against
    +LA trains once per draw, and the +LA candidate's planted F1 is that of the logit-adjusted predictions, the
    prior counted from the problem's own known labels and pseudo-labels (computed here from the formula)."""
    from ncdlr.methods.posthoc import logit_adjustment, pseudo_label_counts

    splits, cfg = unlabeled_novel_table(), tiny_config()
    runs, real_train = [], rehearsal.train
    monkeypatch.setattr(rehearsal, "train", lambda trial_cfg, trained_on: runs.append(real_train(trial_cfg, trained_on))
                        or runs[-1])
    pool = {}

    def la(trial, _ku):
        trial.method.posthoc = "la"

    scores = rehearsal.rehearse(cfg, splits, {"plain": lambda trial, ku: None, "la": la}, draws=2,
                                pseudo_novel_fraction=0.5, pool=pool, planted=True)
    assert len(runs) == 2  # one training per draw, not one per candidate
    for draw, run in enumerate(runs):
        problem, info = planted_splits(splits, ValidationConfig(seed=cfg.run.seed + draw, pseudo_novel_fraction=0.5))
        logits = run.method.predict_logits(run.model, embed(run.model, problem.features["novel"]))
        counts = pseudo_label_counts(problem.labels["known"], logits[:, problem.num_known:], problem.num_known)
        adjusted = logit_adjustment(logits, counts, cfg.method.temperature).argmax(1)
        y = problem.labels["novel"].numpy()
        assert pool["plain"][draw] == planted_scores(y, logits.argmax(1).numpy(), info)["score"]
        assert pool["la"][draw] == planted_scores(y, adjusted.numpy(), info)["score"]
        assert not torch.equal(adjusted, logits.argmax(1))  # the fix moves rows here, so the two scores are two reads
    assert set(scores) == {"plain", "la"} and all(0.0 <= v <= 1.0 for v in scores["la"])


def test_a_training_key_ignores_the_post_hoc_fix_and_nothing_else():
    cfg, fixed, other = tiny_config(), tiny_config(), tiny_config()
    fixed.method.posthoc, other.labeler.gamma = "la+crt", 3.0
    assert rehearsal.training_key(cfg) == rehearsal.training_key(fixed) != rehearsal.training_key(other)
    assert fixed.method.posthoc == "la+crt"  # the key is read off a copy


def test_trainings_kept_across_calls_serve_their_own_draw_only(monkeypatch):
    """``runs``: a caller that rehearses one candidate per call (``ncdlr rehearse``) keeps a draw's training for the
    next candidate of that draw; a new draw drops it."""
    splits, cfg = unlabeled_novel_table(), tiny_config()
    trained = []
    monkeypatch.setattr(rehearsal, "train", lambda trial_cfg, trained_on: trained.append(trial_cfg.run.seed) or "run")
    monkeypatch.setattr(rehearsal, "rehearsal_score", lambda run, problem, split=SCORING_SPLIT, cfg=None: 0.5)

    def la(trial, _ku):
        trial.method.posthoc = "la"

    runs: dict = {}
    for draw, edit in ((0, lambda trial, ku: None), (0, la), (1, la), (1, lambda trial, ku: None)):
        rehearsal.rehearse(cfg, splits, {"one": edit}, draws=1, first_draw=draw, runs=runs)
    assert len(trained) == 2 and len(runs) == 1
    rehearsal.rehearse(cfg, splits, {"one": la}, draws=1, first_draw=1, replicate=1, runs=runs)
    assert len(trained) == 3  # another replicate trains with another seed: not the same training
