"""Issue 6: every method trains on a tiny feature table and beats chance; LA, cRT, AutoNovel and the bounded prior."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest
import torch

from ncdlr.methods import (METHODS, MethodConfigError, build_method, class_balanced_sampler, logit_adjustment,
                           pseudo_label_counts, ranking_pairs)
from ncdlr.data.features import FeatureSplits
from ncdlr.labeler import AdaptiveSelfLabeler
from ncdlr.prototypes import simplex_etf
from ncdlr.service.config import Config, ConfigError, load_config
from ncdlr.service.local import evaluate, train

ROOT = Path(__file__).resolve().parents[2]
KS, KU, DIM = 4, 4, 16


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def tiny_table(seed: int = 0) -> FeatureSplits:
    """Gaussian clusters around orthogonal centres, long-tailed train counts, balanced test."""
    g = torch.Generator().manual_seed(seed)
    centres = 3.0 * torch.eye(DIM)[: KS + KU]
    counts = [120, 60, 30, 20] * 2

    def draw(labels):
        return centres[labels] + 0.6 * torch.randn(len(labels), DIM, generator=g)

    train_y = torch.cat([torch.full((n,), c) for c, n in enumerate(counts)])
    test_y = torch.arange(KS + KU).repeat_interleave(25)
    x = draw(train_y)
    known = train_y < KS
    return FeatureSplits({"known": x[known], "novel": x[~known], "test": draw(test_y)},
                         {"known": train_y[known], "novel": train_y[~known], "test": test_y}, KS, KU,
                         [str(i) for i in range(KS + KU)])


class EtfModel:
    """The least a method needs of a model (:class:`ncdlr.methods.PrototypeModel`): fixed ETF prototypes ``[D, K]``."""

    num_known, num_novel, learnable_prototypes = KS, KU, False
    prototypes = simplex_etf(DIM, KS + KU, seed=0)

    def class_prototypes(self):
        return self.prototypes


def tiny_config(method: str, **labeler) -> Config:
    cfg = Config()
    cfg.method.name = method
    cfg.model.head, cfg.model.head_dim = "linear", 16
    cfg.model.prototypes = "etf" if method == "ncdlr" else "learnable"
    cfg.data.batch_size, cfg.data.feature_noise = 32, 0.1
    cfg.optim.epochs, cfg.optim.lr, cfg.optim.min_lr, cfg.optim.warmup_epochs = 8, 1e-2, 1e-3, 1
    cfg.labeler.gamma, cfg.labeler.buffer_size, cfg.labeler.outer_steps = 2.0, 256, 5
    cfg.labeler.use_buffer = method == "ncdlr"
    for key, value in labeler.items():
        setattr(cfg.labeler, key, value)
    return cfg


@pytest.mark.parametrize("method, labeler", [("ncdlr", {}), ("ncdlr", {"prior": "bounded", "max_imbalance": 6.0}),
                                             ("ncdlr", {"prior": "uniform", "reg_m": 0.45, "novel_reweight": 1.0}),
                                             ("uno", {}), ("autonovel", {})])
def test_each_method_trains_on_a_tiny_table_and_beats_chance(method, labeler):
    splits = tiny_table()
    cfg = tiny_config(method, **{k: v for k, v in labeler.items() if k != "novel_reweight"})
    cfg.method.novel_reweight = labeler.get("novel_reweight", 0.0)  # a method key beside the labeler's
    run = train(cfg, splits)
    results = evaluate(run, splits, posthoc=("none", "la", "crt"), crt_epochs=3)
    for posthoc, metrics in results.items():
        assert metrics["known"] > 0.9, (posthoc, metrics)
        # chance under one Hungarian matching of 8 classes is well below 0.5 on a balanced test set
        assert metrics["novel"] > 0.5, (posthoc, metrics)


def test_logit_adjustment_subtracts_log_prior_and_leaves_zero_count_classes_unchanged():
    logits = torch.randn(5, 4)
    counts = torch.tensor([6, 0, 3, 1])
    adjusted = logit_adjustment(logits, counts, temperature=0.5)
    prior = counts / counts.sum()
    assert torch.equal(adjusted[:, 1], logits[:, 1] / 0.5)
    for k in (0, 2, 3):
        assert torch.allclose(adjusted[:, k], logits[:, k] / 0.5 - torch.log(prior[k]))


def test_logit_adjustment_rejects_counts_of_the_wrong_shape_or_all_zero():
    with pytest.raises(ValueError, match="class_counts"):
        logit_adjustment(torch.randn(2, 3), torch.ones(4))
    with pytest.raises(ValueError, match="class_counts"):
        logit_adjustment(torch.randn(2, 3), torch.zeros(3))


def test_pseudo_label_counts_add_novel_argmax_to_known_labels():
    counts = pseudo_label_counts(torch.tensor([0, 0, 1]), torch.tensor([[0.1, 0.9], [0.8, 0.2], [0.0, 1.0]]), 2)
    assert counts.tolist() == [2, 1, 1, 2]


def test_crt_sampler_draws_every_class_equally_often():
    labels = torch.cat([torch.zeros(1000), torch.ones(10), torch.full((50,), 2)]).long()
    sampler = class_balanced_sampler(labels, 30000, torch.Generator().manual_seed(0))
    drawn = labels[torch.tensor(list(sampler))]
    freq = torch.bincount(drawn, minlength=3).float() / len(drawn)
    assert torch.allclose(freq, torch.full((3,), 1 / 3), atol=0.015), freq


def test_crt_sampler_rejects_empty_labels():
    with pytest.raises(ValueError, match="labels"):
        class_balanced_sampler(torch.zeros(0, dtype=torch.long), 4, torch.Generator())


def test_autonovel_pairs_are_symmetric_and_match_a_brute_force_rank_check():
    feats = torch.randn(40, 12, generator=torch.Generator().manual_seed(1))
    feats[20:] = feats[:20] + 0.01 * torch.randn(20, 12, generator=torch.Generator().manual_seed(2))  # many positives
    pairs = ranking_pairs(feats, 5)
    assert torch.equal(pairs, pairs.T)
    top = [set(sorted(range(12), key=lambda d: -float(row[d]))[:5]) for row in feats]
    for i, j in itertools.product(range(40), repeat=2):
        assert pairs[i, j] == float(top[i] == top[j])
    assert pairs.sum() > 40  # the near-copies are positives, not only the diagonal


def test_autonovel_rejects_topk_larger_than_the_feature_width():
    with pytest.raises(ValueError, match="topk"):
        ranking_pairs(torch.randn(3, 4), 5)


def test_bounded_prior_keeps_tau_below_its_bound_where_the_faithful_prior_runs_away():
    scores = torch.randn(512, 10, generator=torch.Generator().manual_seed(0)) * 0.2
    scores[:, 0] += 0.6  # one dominant cluster: the gain keeps asking for more skew
    free = AdaptiveSelfLabeler(10, gamma=0.1)
    bounded = AdaptiveSelfLabeler(10, prior="bounded", gamma=0.1, max_imbalance=8.0)
    assert bounded.imbalance_factor == pytest.approx(2.0)
    for _ in range(60):
        free(scores)
        bounded(scores)
    assert free.imbalance_factor > 20
    assert 2.0 < bounded.imbalance_factor < 8.0


def test_bounded_prior_needs_a_bound_above_one():
    with pytest.raises(ValueError, match="max_imbalance"):
        AdaptiveSelfLabeler(5, prior="bounded")
    with pytest.raises(ValueError, match="max_imbalance"):
        AdaptiveSelfLabeler(5, prior="bounded", max_imbalance=1.0)


def test_bounded_prior_state_round_trips():
    a = AdaptiveSelfLabeler(6, prior="bounded", gamma=0.5, max_imbalance=5.0)
    scores = torch.randn(64, 6)
    a(scores)
    b = AdaptiveSelfLabeler(6, prior="bounded", gamma=0.5, max_imbalance=5.0)
    b.load_state_dict(a.state_dict())
    assert torch.equal(a(scores), b(scores))
    assert a.imbalance_factor == b.imbalance_factor


def test_method_config_rejects_unknown_names_and_losses_naming_the_key():
    with pytest.raises(ConfigError, match="method.name"):
        load_config(None, ["--method.name", "dino"])
    with pytest.raises(ConfigError, match="method.loss"):
        load_config(None, ["--method.loss", "hinge"])
    with pytest.raises(ConfigError, match="model.prototypes"):
        load_config(None, ["--prototypes", "random"])


@pytest.mark.parametrize("method", ["uno", "autonovel"])
def test_baselines_refuse_fixed_prototypes_naming_the_switch(method):
    cfg = tiny_config(method)
    cfg.model.prototypes = "etf"
    with pytest.raises(MethodConfigError, match="model.prototypes=learnable"):
        train(cfg, tiny_table())


@pytest.mark.parametrize("method", ["uno", "autonovel"])
def test_baselines_refuse_the_shared_buffer_naming_the_switch(method):
    cfg = Config()
    cfg.method.name = method
    with pytest.raises(MethodConfigError, match="labeler.use_buffer=false"):
        build_method(cfg.method, cfg.labeler, KU)


@pytest.mark.parametrize("method", ["uno", "autonovel"])
def test_naming_a_baseline_alone_sets_what_it_needs(method):
    """``--method.name uno`` alone trains UNO: the method's requirements are applied under explicit settings."""
    cfg = load_config(None, ["--method.name", method])
    assert (cfg.model.prototypes, cfg.labeler.use_buffer) == ("learnable", False)
    assert build_method(cfg.method, cfg.labeler, KU).name == method
    with pytest.raises(ConfigError, match="model.prototypes='learnable'"):
        load_config(None, ["--method.name", method, "--prototypes", "etf"])
    with pytest.raises(ConfigError, match="labeler.use_buffer=False"):
        load_config(None, ["--method.name", method, "--use-buffer", "true"])


def test_uno_on_top_of_a_dataset_config_holds_its_sizes_unless_the_command_line_relaxes_them(tmp_path, caplog):
    """A dataset config's relaxed sizes are chosen for ncdlr: ``--config F --method.name uno`` trains UNO as published
    (sizes held, no floor) and logs it; ``--labeler.reg_m`` on the command line, or ``method.name: uno`` in the same
    file, keeps the relaxation; ncdlr keeps the file's value."""
    config = tmp_path / "dataset.yaml"
    config.write_text("labeler:\n  prior: uniform\n  reg_m: 0.45\n  size_floor: known\n  relax_after_epochs: 1\n"
                      "  relax_bound: known\n")
    with caplog.at_level("WARNING", logger="ncdlr.service.config"):
        uno = load_config(config, ["--method.name", "uno"])
    assert (uno.labeler.reg_m, uno.labeler.size_floor, uno.labeler.relax_after_epochs, uno.labeler.relax_bound) == (
        0.0, "none", 0.0, "none")
    assert "labeler.reg_m=0.45" in caplog.text and "method.name='uno'" in caplog.text
    assert build_method(uno.method, uno.labeler, KU).labeler.kappa == 1.0
    assert load_config(config, []).labeler.reg_m == 0.45
    assert load_config(config, ["--method.name", "uno", "--labeler.reg_m", "0.3"]).labeler.reg_m == 0.3
    both = tmp_path / "uno-relaxed.yaml"
    both.write_text("method:\n  name: uno\nlabeler:\n  reg_m: 0.45\n")
    assert load_config(both, []).labeler.reg_m == 0.45


@pytest.mark.parametrize("method", ["uno", "autonovel"])
def test_a_baseline_on_top_of_a_dataset_config_trains_without_ncdlrs_loss_options(tmp_path, caplog, method):
    """configs/openclipart.yaml sets ncdlr's block term and class-balanced known loss (session 35): ``--config F
    --method.name uno`` / ``autonovel`` trains the baseline as published (both off) and logs it; the command line
    keeps them; ncdlr keeps the file's values."""
    config = tmp_path / "dataset.yaml"
    config.write_text("method:\n  task_weight: 1\n  known_reweight: 1\n")
    with caplog.at_level("WARNING", logger="ncdlr.service.config"):
        baseline = load_config(config, ["--method.name", method])
    assert (baseline.method.task_weight, baseline.method.known_reweight) == (0.0, 0.0)
    assert "method.task_weight=1.0" in caplog.text and "method.known_reweight=1.0" in caplog.text
    built = build_method(baseline.method, baseline.labeler, KU)
    assert (built.task_weight, built.known_reweight) == (0.0, 0.0)
    ncdlr = load_config(config, [])
    assert (ncdlr.method.task_weight, ncdlr.method.known_reweight) == (1.0, 1.0)
    kept = load_config(config, ["--method.name", method, "--method.task_weight", "0.5"])
    assert (kept.method.task_weight, kept.method.known_reweight) == (0.5, 0.0)


def test_the_openclipart_config_trains_ncdlr_with_both_loss_options_and_uno_as_published():
    """The shipped config (session 35's planted rehearsal chose the pair on both partitions): ncdlr gets the block
    term and the class-balanced known loss at weight 1, UNO on the same file neither, with held sizes."""
    config = ROOT / "configs" / "openclipart.yaml"
    ncdlr = load_config(config, [])
    assert (ncdlr.method.task_weight, ncdlr.method.known_reweight, ncdlr.labeler.reg_m) == (1.0, 1.0, 0.45)
    uno = load_config(config, ["--method.name", "uno"])
    assert (uno.method.task_weight, uno.method.known_reweight, uno.labeler.reg_m) == (0.0, 0.0, 0.0)


@pytest.mark.parametrize("name", ["openclipart.yaml", "fashion_mnist.yaml"])
def test_the_dataset_configs_bound_their_relaxed_sizes_by_the_known_classes(name):
    """Both shipped configs relax the sizes with ``labeler.relax_bound known`` (session 49): ncdlr reads it, UNO on
    the same file holds its sizes without it, and ``--labeler.reg_m 0`` (the paper's held sizes, as the README
    suggests for a new set) leaves it inert rather than refused."""
    config = ROOT / "configs" / name
    ncdlr = load_config(config, [])
    assert (ncdlr.labeler.prior, ncdlr.labeler.reg_m, ncdlr.labeler.relax_bound) == ("uniform", 0.45, "known")
    assert load_config(config, ["--method.name", "uno"]).labeler.relax_bound == "none"
    held = load_config(config, ["--labeler.prior", "adaptive", "--labeler.reg_m", "0"])
    assert build_method(held.method, held.labeler, KU).labeler.relax_bound is None


def test_build_method_resolves_the_loss_per_method():
    cfg = Config()
    assert build_method(cfg.method, cfg.labeler, KU).loss == "mse"
    cfg.labeler.use_buffer = False
    for name in METHODS:
        cfg.method.name = name
        assert build_method(cfg.method, cfg.labeler, KU).name == name
    cfg.method.name = "uno"
    assert build_method(cfg.method, cfg.labeler, KU).loss == "ce"


def test_build_method_takes_the_labeler_from_its_config_section():
    """γ and every other labeler field reach the labeler straight from the ``labeler`` section (no hand copy)."""
    cfg = load_config(None, ["--gamma", "7.5", "--labeler.eps", "0.02", "--labeler.outer-steps", "4"])
    labeler = build_method(cfg.method, cfg.labeler, KU).labeler
    assert (labeler.gamma, labeler.eps, labeler.outer_steps, labeler.num_clusters) == (7.5, 0.02, 4, KU)


def test_relaxed_sizes_reach_every_heads_labeler_of_ncdlr_and_uno():
    """``labeler.reg_m`` means the same for both self-labeling methods: UNO's balanced Sinkhorn is relaxed too."""
    cfg = load_config(None, ["--reg-m", "0.45"])
    uno_cfg = load_config(None, ["--reg-m", "0.45", "--method.name", "uno", "--use-buffer", "false"])
    for made in (build_method(cfg.method, cfg.labeler, KU, heads=2),
                 build_method(uno_cfg.method, uno_cfg.labeler, KU, heads=2)):
        assert [labeler.reg_m for labeler in made.labelers] == [0.45, 0.45]
        assert made.labelers[0].kappa == pytest.approx(0.9)
    assert build_method(uno_cfg.method, load_config(None, ["--use-buffer", "false"]).labeler, KU).labeler.kappa == 1.0


def test_anchored_prior_stays_near_its_anchor_where_the_faithful_prior_runs_away():
    scores = torch.randn(512, 10, generator=torch.Generator().manual_seed(0)) * 0.2
    scores[:, 0] += 0.6
    anchored = AdaptiveSelfLabeler(10, prior="anchored", gamma=10.0, max_imbalance=8.0)
    assert anchored.imbalance_factor == pytest.approx(2.0)
    for _ in range(40):
        anchored(scores)
    assert 4.0 < anchored.imbalance_factor < 16.0


def test_anchored_prior_with_a_huge_gamma_is_the_fixed_geometric_prior():
    from ncdlr.priors import cluster_prior

    scores = torch.randn(256, 6, generator=torch.Generator().manual_seed(3))
    anchored = AdaptiveSelfLabeler(6, prior="anchored", gamma=1e6, max_imbalance=5.0, init_t=math.log(4.0), lr=1e-4)
    fixed = AdaptiveSelfLabeler(6, prior="fixed", fixed_prior=cluster_prior(torch.tensor(math.log(4.0)), 6))
    assert torch.allclose(anchored(scores), fixed(scores), atol=1e-4)


def test_anchored_prior_needs_an_anchor():
    with pytest.raises(ValueError, match="max_imbalance"):
        AdaptiveSelfLabeler(5, prior="anchored")


def test_known_loss_ce_puts_cross_entropy_on_the_labelled_rows_and_keeps_mse_for_the_pseudo_labels():
    """``method.known_loss=ce``: the known rows' loss is cross-entropy on cos/T, the novel rows' stays MSE."""
    from ncdlr.losses import prototype_cross_entropy, prototype_mse

    cfg = load_config(None, ["--method.known_loss", "ce"])
    method = build_method(cfg.method, cfg.labeler, KU)
    assert (method.loss, method.known_loss_kind) == ("mse", "ce")
    assert build_method(Config().method, Config().labeler, KU).known_loss_kind == "mse"  # auto: the one loss

    g = torch.Generator().manual_seed(1)
    z1, z2 = (torch.nn.functional.normalize(torch.randn(6, DIM, generator=g), dim=1) for _ in range(2))
    labels = torch.tensor([0, 1, 2, 3, 0, 1])
    p = EtfModel.prototypes
    expected = 0.5 * (prototype_cross_entropy(z1, p, labels, 0.1) + prototype_cross_entropy(z2, p, labels, 0.1))
    assert method.known_loss(EtfModel(), z1, z2, labels) == pytest.approx(float(expected), rel=1e-6)
    q = torch.softmax(torch.randn(2, 6, KU, generator=g), dim=2)
    valid = torch.ones(6, dtype=torch.bool)
    padded = [torch.cat([torch.zeros(6, KS), q[v]], dim=1) for v in (0, 1)]
    expected = 0.5 * (prototype_mse(z2, p, padded[0]) + prototype_mse(z1, p, padded[1]))
    assert method.novel_loss(EtfModel(), z1, z2, q, valid) == pytest.approx(float(expected), rel=1e-6)
    with pytest.raises(ConfigError, match="method.known_loss"):
        load_config(None, ["--method.known_loss", "hinge"])


def test_known_reweight_weighs_each_labelled_row_by_its_class_count_and_needs_the_counts():
    """``method.known_reweight q``: the known loss is ``Σ w l / Σ w`` with ``w = n_c^-q`` from the counts given to
    :func:`build_method`; the novel loss is untouched; q = 0 is the plain mean; q > 0 without counts is refused at the
    first known loss (prediction needs none), and a negative q or q with mixup is refused by the config."""
    from ncdlr.losses import prototype_cross_entropy, prototype_mse

    g = torch.Generator().manual_seed(2)
    z1, z2 = (torch.nn.functional.normalize(torch.randn(7, DIM, generator=g), dim=1) for _ in range(2))
    labels = torch.tensor([0, 0, 0, 0, 1, 2, 3])
    counts = [120, 60, 30, 20]
    p = EtfModel.prototypes
    plain = build_method(Config().method, Config().labeler, KU, known_counts=counts)
    assert plain.known_class_weights is None
    expected = 0.5 * (prototype_mse(z1, p, labels) + prototype_mse(z2, p, labels))
    assert plain.known_loss(EtfModel(), z1, z2, labels) == pytest.approx(float(expected), rel=1e-6)

    for name, loss in (("uno", prototype_cross_entropy), ("ncdlr", prototype_mse)):  # UNO's known loss is CE
        cfg = load_config(None, ["--method.known_reweight", "1", "--method.name", name])
        weighted = build_method(cfg.method, cfg.labeler, KU, known_counts=counts)
        w = torch.tensor([1 / counts[c] for c in labels.tolist()])
        expected = 0.5 * sum(((w * torch.stack([loss(z[i:i + 1], p, labels[i:i + 1]) for i in range(7)])).sum()
                              / w.sum()) for z in (z1, z2))
        assert weighted.known_loss(EtfModel(), z1, z2, labels) == pytest.approx(float(expected), rel=1e-5)
    q = torch.softmax(torch.randn(2, 7, KU, generator=g), dim=2)
    valid = torch.ones(7, dtype=torch.bool)
    assert weighted.novel_loss(EtfModel(), z1, z2, q, valid) == pytest.approx(float(plain.novel_loss(EtfModel(), z1, z2, q, valid)))
    unweighed = build_method(cfg.method, cfg.labeler, KU)
    with pytest.raises(MethodConfigError, match="training counts"):
        unweighed.known_loss(EtfModel(), z1, z2, labels)
    with pytest.raises(ConfigError, match="method.known_reweight"):
        load_config(None, ["--method.known_reweight", "-0.5"])
    with pytest.raises(ConfigError, match="optim.mixup"):
        load_config(None, ["--method.known_reweight", "1", "--optim.mixup", "0.4"])


def test_novel_reweight_weighs_each_pseudo_labelled_row_by_its_clusters_size_in_the_solve():
    """``method.novel_reweight r``: the discovery step records each cluster's rows in the solve (the soft labels'
    column sums over buffer history + batch) and the batch's labels stay those of the plain step; the swapped loss is
    ``½ Σ_v Σ w l / Σ w`` with ``w_i = Σ_k q_ik s_k^-r`` (a cluster under one row counts as one), computed here from
    the labeler's own full solve; r = 0 records nothing and is the plain mean."""
    from ncdlr.buffer import LocalBuffer

    g = torch.Generator().manual_seed(5)
    history = torch.nn.functional.normalize(torch.randn(40, DIM, generator=g), dim=1)
    z1, z2 = (torch.nn.functional.normalize(torch.randn(6, DIM, generator=g), dim=1) for _ in range(2))
    valid = torch.tensor([True, True, False, True, True, True])
    pu = EtfModel.prototypes[:, KS:]
    made = {}
    for r in (0.0, 1.0):
        cfg = load_config(None, ["--labeler.prior", "uniform", "--labeler.reg_m", "0.45",
                                 "--method.novel_reweight", str(r)])
        method = build_method(cfg.method, cfg.labeler, KU)
        buffer = LocalBuffer(capacity=40, num_clusters=KU)
        buffer.history_plus(0, history @ pu)
        method.connect(buffer=buffer)
        made[r] = (method, *method.novel_targets(EtfModel(), z1, z2, valid, step=1))
    (plain, q_plain, _), (weighted, q, _) = made[0.0], made[1.0]
    assert plain.novel_sizes is None
    torch.testing.assert_close(q, q_plain)
    twin = LocalBuffer(capacity=40, num_clusters=KU)  # the solve's problem: the history, then both views' valid rows
    twin.history_plus(0, history @ pu)
    scores = twin.history_plus(1, torch.cat([z1[valid], z2[valid]]) @ pu)
    reference = AdaptiveSelfLabeler(KU, prior="uniform", reg_m=0.45)(scores)
    sizes = reference.sum(0)
    torch.testing.assert_close(weighted.novel_sizes, sizes)
    assert sizes.max() / sizes.min() > 1.2  # relaxed sizes differ, so the weights matter
    per_cluster = 1.0 / sizes.clamp(min=1.0)

    def swapped_term(z, target):  # Σ w l / Σ w over the valid rows, w = target's clusters' 1/size
        w = target @ per_cluster
        per_row = (target * ((z[:, :, None] - pu[None]) ** 2).sum(1)).sum(1)
        return (w * per_row).sum() / w.sum()

    expected = 0.5 * (swapped_term(z2[valid], q[0][valid]) + swapped_term(z1[valid], q[1][valid]))
    got = weighted.novel_loss(EtfModel(), z1, z2, q, valid)
    assert got == pytest.approx(float(expected), rel=1e-5)
    assert got != pytest.approx(float(plain.novel_loss(EtfModel(), z1, z2, q, valid)), rel=1e-3)


def test_novel_reweight_on_uno_counts_both_views_solves_and_is_reset_by_a_dataset_file(tmp_path):
    """UNO solves each view's batch on its own: a cluster's size is its rows over both solves. From a dataset file
    the option is one of ncdlr's loss options a baseline does not take (given on the command line it applies)."""
    g = torch.Generator().manual_seed(6)
    z1, z2 = (torch.nn.functional.normalize(torch.randn(8, DIM, generator=g), dim=1) for _ in range(2))
    valid = torch.ones(8, dtype=torch.bool)
    cfg = load_config(None, ["--method.name", "uno", "--method.novel_reweight", "1"])
    uno = build_method(cfg.method, cfg.labeler, KU)
    p = torch.nn.functional.normalize(torch.randn(DIM, KS + KU, generator=g), dim=0)

    class Learnable(EtfModel):
        learnable_prototypes = True

        def class_prototypes(self):
            return p

    q, _ = uno.novel_targets(Learnable(), z1, z2, valid, step=0)
    torch.testing.assert_close(uno.novel_sizes, q[0].sum(0) + q[1].sum(0))
    config = tmp_path / "dataset.yaml"
    config.write_text("method:\n  novel_reweight: 1\n")
    assert load_config(config, ["--method.name", "uno"]).method.novel_reweight == 0.0
    assert load_config(config, []).method.novel_reweight == 1.0


@pytest.mark.parametrize("args, match", [
    (["--method.novel_reweight", "-1"], "method.novel_reweight"),
    (["--method.novel_reweight", "1", "--method.name", "autonovel"], "autonovel"),
    (["--method.novel_reweight", "1", "--model.heads", "2"], "heads 2"),
    (["--method.novel_reweight", "1", "--optim.mixup", "0.4"], "mixup 0.4"),
])
def test_novel_reweight_refuses_what_has_no_one_solve_of_cluster_sizes(args, match):
    """Refused before training, naming the key: a negative power; AutoNovel (no clusters solved); several heads (the
    loss would weigh every head by head 0's sizes); mixup (the mixed rows' novel term would stay unweighted)."""
    with pytest.raises(ConfigError, match=match):
        load_config(None, args)
