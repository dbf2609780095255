"""Smoke subset of benchmarks/quality.py: two synthetic cells with a tiny budget, cached, rendered as tables."""

from __future__ import annotations

import json

import pytest
import torch

from tests.fixtures.activation_caches import write_activation_cache
from tests.fixtures.benchmarks import load_benchmark


def test_quality_smoke_grid_writes_cached_cells_and_paper_style_tables(tmp_path):
    quality = load_benchmark("quality")
    threads = torch.get_num_threads()
    try:
        code = quality.main(["--datasets", "synthetic", "--seeds", "1", "--variants", "uno", "ncdlr", "--epochs", "2",
                             "--results", str(tmp_path / "cells"), "--out", str(tmp_path / "results.md")])
    finally:
        torch.set_num_threads(threads)
    assert code == 0
    cells = sorted((tmp_path / "cells").glob("*.json"))
    assert [c.name for c in cells] == ["synthetic-ncdlr-s0-e2.json", "synthetic-uno-s0-e2.json"]
    ncdlr = json.loads(cells[0].read_text())
    assert set(ncdlr["results"]) == {"none", "la", "crt"} and ncdlr["tau_final"] > 1.0
    # kept for benchmarks/seed_spread.py: the plain model's test predictions (their accuracy is the "none" row's)
    # and the clustering of the novel training rows
    from ncdlr.metrics import cluster_accuracy
    splits = quality.synthetic_splits(0)
    assert cluster_accuracy(splits.labels["test"].numpy(), ncdlr["test_pred"], splits.num_known)["novel"] == \
        ncdlr["results"]["none"]["novel"]
    assert 0 <= ncdlr["novel_train"]["all"] <= 1 and "novel_tail" in ncdlr["novel_train"]
    # and the task-aware test predictions (novel columns only): where the argmax over all K is a novel column,
    # it is the same column
    ks, aware = splits.num_known, ncdlr["test_novel_pred"]
    assert len(aware) == len(ncdlr["test_pred"]) and 0 <= min(aware) and max(aware) < splits.num_novel
    assert all(a == p - ks for a, p in zip(aware, ncdlr["test_pred"]) if p >= ks)
    assert ncdlr["holdout_view"] is False and ncdlr["novel_heldout_pred"] is None
    # the training rows' clusters themselves, whose accuracy is novel_train's (a matching fitted on them can be
    # carried to the test split)
    novel_y = splits.labels["novel"].numpy() - splits.num_known
    assert len(ncdlr["novel_train_pred"]) == len(novel_y)
    assert cluster_accuracy(novel_y, ncdlr["novel_train_pred"], 0)["all"] == pytest.approx(ncdlr["novel_train"]["all"])
    text = (tmp_path / "results.md").read_text()
    begin, end = quality.markers()
    assert begin in text and end in text
    assert "| uno +cRT |" in text and "| ncdlr +LA |" in text and "novel_tail" in text


def test_quality_rewrites_only_the_generated_block(tmp_path):
    quality = load_benchmark("quality")
    doc = tmp_path / "results.md"
    begin, end = quality.markers()
    doc.write_text(f"# Title\n\nanalysis above\n\n{begin}\nold table\n{end}\n\nanalysis below\n")
    quality.write_between_markers(doc, "new table\n")
    text = doc.read_text()
    assert "old table" not in text and "new table" in text
    assert text.startswith("# Title\n\nanalysis above") and text.rstrip().endswith("analysis below")


def test_select_runs_the_datasets_rehearsal_once_and_the_val_variant_trains_with_its_choice(tmp_path):
    quality = load_benchmark("quality")
    threads = torch.get_num_threads()
    cells = tmp_path / "cells"
    try:
        try:  # without a rehearsal on record the variant refuses, naming the flag
            quality.main(["--datasets", "synthetic", "--seeds", "1", "--variants", "ncdlr-val", "--epochs", "1",
                          "--results", str(cells)])
            raise AssertionError("ncdlr-val ran without a rehearsal")
        except SystemExit as refused:
            assert "--select" in str(refused)
        code = quality.main(["--datasets", "synthetic", "--seeds", "1", "--variants", "ncdlr-val", "--epochs", "1",
                             "--select", "--results", str(cells)])
    finally:
        torch.set_num_threads(threads)
    assert code == 0
    chosen = json.loads((cells / "select-synthetic-e1.json").read_text())
    assert set(chosen["scores"]) == {"inf", "0.15", "0.5", "1.5"}
    assert all(len(v) == quality.SELECT_DRAWS for v in chosen["per_draw"].values())
    cell = json.loads((cells / "synthetic-ncdlr-val-s0-e1.json").read_text())
    assert cell["gamma_selection"] == chosen["scores"]
    if chosen["uniform"]:
        assert cell["tau_final"] is None
    else:
        assert cell["gamma"] == chosen["gamma"]


def test_workers_split_the_grid_over_processes_and_render_every_cell(tmp_path):
    quality = load_benchmark("quality")
    threads = torch.get_num_threads()
    cells = tmp_path / "cells"
    try:
        code = quality.main(["--datasets", "synthetic", "--seeds", "2", "--variants", "uno", "ncdlr-val", "--epochs", "1",
                             "--select", "--workers", "2", "--results", str(cells), "--out", str(tmp_path / "r.md")])
    finally:
        torch.set_num_threads(threads)
    assert code == 0
    names = sorted(c.name for c in cells.glob("synthetic-*.json"))
    assert names == [f"synthetic-{v}-s{s}-e1.json" for v in ("ncdlr-val", "uno") for s in (0, 1)]
    assert (cells / "select-synthetic-e1.json").is_file()
    text = (tmp_path / "r.md").read_text()
    assert "| uno |" in text and "| ncdlr-val |" in text and "seeds [0, 1]" in text


def test_select_setting_rehearses_the_warm_up_once_and_reads_each_choice_from_the_draws(tmp_path):
    quality = load_benchmark("quality")
    threads = torch.get_num_threads()
    cells = tmp_path / "cells"
    try:
        code = quality.main(["--datasets", "synthetic", "--seeds", "0", "--epochs", "2", "--select-warmup",
                             "--results", str(cells)])
    finally:
        torch.set_num_threads(threads)
    assert code == 0
    path = cells / "select-warmup-synthetic-e2.json"
    recorded = json.loads(path.read_text())
    assert set(recorded["per_draw"]) == {"0.0", "1.0"}
    assert all(len(v) == quality.SELECT_DRAWS and all(0 <= s <= 1 for s in v) for v in recorded["per_draw"].values())
    recorded["per_draw"] = {"0.0": [0.3, 0.4, 0.35], "1.0": [0.4, 0.5, 0.46]}  # a clear win, read back: chosen
    path.write_text(json.dumps(recorded))
    assert quality.setting_selection(cells, "synthetic", None, 2, "warmup")["known_warmup_epochs"] == 1.0
    recorded["per_draw"] = {"0.0": [0.3, 0.4, 0.35], "1.0": [0.31, 0.38, 0.36]}  # no clear win: the default stays
    path.write_text(json.dumps(recorded))
    assert quality.setting_selection(cells, "synthetic", None, 2, "warmup")["known_warmup_epochs"] == 0.0


def test_the_sizes_rehearsal_reads_its_choice_among_named_edits_from_the_draws(tmp_path):
    """The ``sizes`` rehearsal (held / relaxed / relaxed with the uniform prior) read back from its cached draws; the
    trainings themselves are the rehearsal's own (tests/tuning/test_rehearsal.py)."""
    quality = load_benchmark("quality")
    key, candidates, default = quality.rehearsal_candidates("sizes")
    assert key == "sizes" and default == "held" and candidates["held"] == {}
    assert candidates["uniform-relaxed"] == {"labeler.prior": "uniform", "labeler.reg_m": quality.RELAX_REG_M}
    relax = quality.RELAX_REG_M
    assert quality.rehearsal_candidates("relax") == ("labeler.reg_m", {0.0: {"labeler.reg_m": 0.0},
                                                                      relax: {"labeler.reg_m": relax}}, 0.0)
    path = tmp_path / "select-sizes-synthetic-e2.json"
    clear = {"held": [0.3, 0.4, 0.35], "relaxed": [0.31, 0.39, 0.37], "uniform-relaxed": [0.4, 0.5, 0.46]}
    path.write_text(json.dumps({"dataset": "synthetic", "key": "sizes", "per_draw": clear, "draws": 3}))
    chosen = quality.setting_selection(tmp_path, "synthetic", None, 2, "sizes")
    assert chosen["sizes"] == "uniform-relaxed" and chosen["scores"]["held"] == pytest.approx(0.35)
    path.write_text(json.dumps({"dataset": "synthetic", "key": "sizes", "draws": 3,
                                "per_draw": {**clear, "uniform-relaxed": [0.2, 0.6, 0.3]}}))
    assert quality.setting_selection(tmp_path, "synthetic", None, 2, "sizes")["sizes"] == "held"


def test_table_overrides_name_a_cached_dataset_and_keep_the_other_defaults():
    quality = load_benchmark("quality")
    tables = quality.activation_tables(["openclipart-cached-p2=s3://bucket/p2"])
    assert tables["openclipart-cached-p2"] == "s3://bucket/p2"
    assert tables["openclipart-cached"] == quality.CACHED["openclipart-cached"]
    with pytest.raises(ValueError, match="names no cached dataset: openclipart-cached-p9"):
        quality.activation_tables(["openclipart-cached-p9=/tmp/x"])
    with pytest.raises(ValueError, match="DATASET=URI"):
        quality.activation_tables(["/work/cache/oc-p2-lite0-160-b1-v8"])


def test_every_cached_dataset_gets_the_cached_budget_with_gamma_half_its_novel_count():
    """configs/openclipart.yaml's budget on every activation cache; γ = 0.5·Ku (10 at OpenClipart-LT's Ku = 21, as
    every cell since session 7; 2.5 at Fashion-MNIST-LT's Ku = 5; 17.5 at Emoji-LT's Ku = 35; 4.5 at Phosphor-LT's
    Ku = 9; 13.5 at MDI-LT's Ku = 27)."""
    quality = load_benchmark("quality")
    assert "fashion-cached" in quality.CACHED
    for name in quality.CACHED:
        cfg = quality.dataset_config(name, None)
        assert (cfg.data.batch_size, cfg.labeler.buffer_size, cfg.model.trainable_blocks) == (64, 512, 1)
        assert (cfg.optim.epochs, cfg.optim.lr, cfg.model.head) == (10, 1e-3, "linear")
        expected = {"fashion": 2.5, "emoji": 17.5, "phosphor": 4.5, "mdi": 13.5}.get(name.split("-")[0], 10.0)
        assert cfg.labeler.gamma == expected
    assert quality.dataset_config("fashion-cached", 3).optim.epochs == 3


def test_the_epoch_trace_reads_the_test_split_without_changing_the_run(one_torch_thread):
    """``--trace`` scores the test split after every epoch (a diagnosis of when the fit to the training images sets
    in). Reading it must not change training: the traced cell's final scores equal the untraced cell's, and its
    last epoch's test scores are the final model's."""
    quality = load_benchmark("quality")
    splits = quality.synthetic_splits(0)
    plain = quality.run_cell("synthetic", "ncdlr", 0, splits, 2)
    traced = quality.run_cell("synthetic", "ncdlr", 0, splits, 2, trace=True)
    assert traced["results"] == plain["results"] and traced["test_pred"] == plain["test_pred"]
    assert [t["epoch"] for t in traced["trace"]] == [1, 2]
    assert traced["trace"][-1]["test_novel"] == plain["results"]["none"]["novel"]
    assert traced["trace"][-1]["test_known"] == plain["results"]["none"]["known"]
    assert all(0 <= t["test_novel"] <= 1 for t in traced["trace"])
    sizes = plain["last_epoch_pseudo_labels"]  # the label-free cluster health of the last epoch, kept per cell
    assert 0 <= sizes["clusters_empty"] < splits.num_novel and sizes["cluster_imbalance"] >= 1


def variant_config(quality, variant: str):
    """The Fashion cache's config with ``quality.VARIANTS[variant]``'s edits applied, as a cell trains with it."""
    cfg = quality.dataset_config("fashion-cached", None)
    for section, values in quality.VARIANTS[variant].items():
        for key, value in values.items():
            setattr(getattr(cfg, section), key, value)
    return cfg


def test_the_nce_variant_trains_the_pseudo_labels_with_cross_entropy_and_the_labelled_rows_with_mse():
    """``ncdlr-uniform-relax-nce`` (session 29) is the configs' setting with only the novel loss switched: the method
    is still ncdlr (fixed ETF prototypes, the buffer), the pseudo-labels' loss is CE over all K, the known rows' MSE."""
    from ncdlr.methods import build_method

    quality = load_benchmark("quality")
    cfg = variant_config(quality, "ncdlr-uniform-relax-nce")
    method = build_method(cfg.method, cfg.labeler, 5)
    assert (method.name, method.loss, method.known_loss_kind) == ("ncdlr", "ce", "mse")
    assert (cfg.labeler.prior, cfg.labeler.reg_m) == ("uniform", quality.RELAX_REG_M)
    assert cfg.model.prototypes == quality.dataset_config("fashion-cached", None).model.prototypes


def test_the_task_variant_adds_only_the_known_novel_term_to_the_configs_setting():
    """``ncdlr-uniform-relax-task`` (session 30): the configs' setting (ETF, MSE for both losses, relaxed uniform
    sizes) with ``method.task_weight`` 1 and nothing else changed."""
    from ncdlr.methods import build_method

    quality = load_benchmark("quality")
    cfg = variant_config(quality, "ncdlr-uniform-relax-task")
    method = build_method(cfg.method, cfg.labeler, 5)
    assert (method.name, method.loss, method.known_loss_kind, method.task_weight) == ("ncdlr", "mse", "mse", 1.0)
    assert (cfg.labeler.prior, cfg.labeler.reg_m) == ("uniform", quality.RELAX_REG_M)
    assert quality.VARIANTS["ncdlr-uniform-relax-task"]["labeler"] == quality.VARIANTS["ncdlr-uniform-relax"]["labeler"]


def test_the_ep_rung_split_variants_change_one_part_of_the_rung_each():
    """Session 51's split of the +EP rung: ``ladder-etf-ce`` is ``ladder-buffer`` with the fixed ETF in place of the
    learnable prototypes (cross-entropy kept); ``ladder-ep-task`` is ``ncdlr-uniform`` (+EP) with the known-vs-novel
    term at weight 1 and nothing else changed; both keep the buffer and the uniform prior."""
    from ncdlr.methods import build_method

    quality = load_benchmark("quality")
    default = quality.dataset_config("fashion-cached", None)
    etf_ce, buffer_rung = variant_config(quality, "ladder-etf-ce"), variant_config(quality, "ladder-buffer")
    assert buffer_rung.model.prototypes == "learnable"
    assert etf_ce.model.prototypes == default.model.prototypes != "learnable"
    for cfg in (etf_ce, buffer_rung):
        method = build_method(cfg.method, cfg.labeler, 5)
        assert (method.name, method.loss, method.known_loss_kind, method.task_weight) == ("ncdlr", "ce", "ce", 0.0)
        assert (cfg.labeler.prior, cfg.labeler.use_buffer) == ("uniform", True)
    ep_task = variant_config(quality, "ladder-ep-task")
    assert quality.VARIANTS["ladder-ep-task"] == {**quality.VARIANTS["ncdlr-uniform"], "method": {"task_weight": 1.0}}
    method = build_method(ep_task.method, ep_task.labeler, 5)
    assert (method.name, method.loss, method.known_loss_kind, method.task_weight) == ("ncdlr", "mse", "mse", 1.0)
    assert (ep_task.labeler.prior, ep_task.labeler.use_buffer, ep_task.labeler.reg_m) == ("uniform", True, 0.0)


def test_session_52_variants_are_the_configs_settings_with_one_field_changed():
    """Session 52's variants: each config's setting (``-bound`` for Fashion-MNIST-LT, ``-task-cb-bound`` for the
    OpenClipart-LT config the later sets use) with Sinkhorn ε 0.01 in place of 0.05, ρ and everything else kept; and
    the OpenClipart-LT config's setting with the buffer of 2048 rows in place of 512; and each config's setting
    trained 20 epochs in place of 10 (the Fashion-MNIST-LT one added in session 53), nothing else changed."""
    quality = load_benchmark("quality")
    for base in ("ncdlr-uniform-relax-bound", "ncdlr-uniform-relax-task-cb-bound"):
        sharp, config = variant_config(quality, f"{base}-eps001"), variant_config(quality, base)
        assert (sharp.labeler.eps, config.labeler.eps) == (0.01, 0.05)
        assert sharp.labeler.reg_m == config.labeler.reg_m > 0
        sharp.labeler.eps = config.labeler.eps
        assert sharp == config
    wide, config = (variant_config(quality, f"ncdlr-uniform-relax-task-cb-bound{suffix}") for suffix in ("-j2048", ""))
    assert (wide.labeler.buffer_size, config.labeler.buffer_size) == (2048, 512)
    wide.labeler.buffer_size = config.labeler.buffer_size
    assert wide == config
    for base in ("ncdlr-uniform-relax-task-cb-bound", "ncdlr-uniform-relax-bound"):  # session 53 added the second
        longer, config = variant_config(quality, f"{base}-e20"), variant_config(quality, base)
        assert (longer.optim.epochs, config.optim.epochs) == (20, 10)
        longer.optim.epochs = config.optim.epochs
        assert longer == config


def test_the_task_and_balance_variant_is_the_configs_setting_with_both_known_side_edits():
    """``ncdlr-uniform-relax-task-cb`` (session 34): the configs' setting with the known-vs-novel term at weight 1 and
    the class-balanced known loss (q = 1), each as its own variant has it, and nothing else changed; the method built
    from it, given the known counts, weighs the rarer known class more and keeps the block term."""
    from ncdlr.methods import build_method

    quality = load_benchmark("quality")
    twin = quality.VARIANTS["ncdlr-uniform-relax"]
    both = quality.VARIANTS["ncdlr-uniform-relax-task-cb"]
    assert both == {**twin, "method": {**quality.VARIANTS["ncdlr-uniform-relax-task"]["method"],
                                       **quality.VARIANTS["ncdlr-uniform-relax-cb"]["method"]}}
    cfg = variant_config(quality, "ncdlr-uniform-relax-task-cb")
    method = build_method(cfg.method, cfg.labeler, 5, known_counts=[30, 10])
    assert (method.name, method.loss, method.known_loss_kind) == ("ncdlr", "mse", "mse")
    assert (method.task_weight, method.known_reweight) == (1.0, 1.0)
    weights = method.known_class_weights
    assert weights is not None and weights[1] == pytest.approx(3 * weights[0])
    assert (cfg.labeler.prior, cfg.labeler.reg_m) == ("uniform", quality.RELAX_REG_M)


def test_the_novel_balance_variant_is_the_configs_pair_with_only_the_novel_reweight_added():
    """``ncdlr-uniform-relax-task-cb-nb`` (session 43): the config's pair and nothing else changed but
    ``method.novel_reweight 1``; its method records the solve's cluster sizes (the pair's does not)."""
    from ncdlr.methods import build_method

    quality = load_benchmark("quality")
    pair = quality.VARIANTS["ncdlr-uniform-relax-task-cb"]
    assert quality.VARIANTS["ncdlr-uniform-relax-task-cb-nb"] == {**pair, "method": {**pair["method"], "novel_reweight": 1.0}}
    built = {name: build_method(variant_config(quality, name).method, variant_config(quality, name).labeler, 5,
                                known_counts=[30, 10])
             for name in ("ncdlr-uniform-relax-task-cb", "ncdlr-uniform-relax-task-cb-nb")}
    assert [m.discovery.sizes for m in built.values()] == [False, True]
    assert built["ncdlr-uniform-relax-task-cb-nb"].novel_reweight == 1.0


@pytest.mark.parametrize("what, challenger, variant", [("task", "uniform-relaxed-task", "ncdlr-uniform-relax-task"),
                                                      ("known-balance", "uniform-relaxed-cb", "ncdlr-uniform-relax-cb"),
                                                      ("task-balance", "uniform-relaxed-task-cb",
                                                       "ncdlr-uniform-relax-task-cb")])
def test_the_task_and_balance_rehearsals_weigh_the_configs_setting_against_their_variants(what, challenger, variant):
    """``--select-setting task`` / ``known-balance`` / ``task-balance``: the default is the configs' setting as it is,
    the challenger the variant's edits (the known-vs-novel term; the class-balanced known loss; both)."""
    quality = load_benchmark("quality")
    key, candidates, default = quality.rehearsal_candidates(what)
    assert (key, default) == (what, "uniform-relaxed")
    edits = quality.VARIANTS[variant]
    as_edits = {f"{section}.{name}": value for section, values in edits.items() for name, value in values.items()}
    assert candidates == {"uniform-relaxed": quality.UNIFORM_RELAXED, challenger: as_edits}


def test_the_config_epochs_rehearsal_weighs_the_openclipart_config_at_10_against_20_epochs():
    """``--select-setting config-epochs`` (session 57): both candidates are configs/openclipart.yaml's whole setting,
    not the paper's algorithm that ``epochs`` edits, and they differ in the run length alone, the config's 10 the
    default."""
    quality = load_benchmark("quality")
    key, candidates, default = quality.rehearsal_candidates("config-epochs")
    assert (key, default, list(candidates)) == ("config-epochs", "config", ["config", "config-e20"])
    config, longer = candidates["config"], candidates["config-e20"]
    assert config["labeler.prior"] == "uniform" and config["labeler.relax_bound"] == "known"
    assert config["method.task_weight"] == config["method.known_reweight"] == 1.0
    assert "optim.epochs" not in config and longer == {**config, "optim.epochs": 20}
    assert quality.dataset_config("openclipart-cached", None).optim.epochs == 10


def test_the_fashion_config_epochs_rehearsal_weighs_the_fashion_config_at_10_against_20_epochs():
    """``--select-setting fashion-config-epochs`` (session 58): the incumbent is configs/fashion_mnist.yaml's setting
    read from the file itself (its sizes and its bound, without the OpenClipart-LT config's block term or balanced
    known loss), and the challenger is the same at 20 epochs; the file trains 10."""
    from pathlib import Path

    from ncdlr.service.config import load_config

    quality = load_benchmark("quality")
    key, candidates, default = quality.rehearsal_candidates("fashion-config-epochs")
    assert (key, default, list(candidates)) == ("fashion-config-epochs", "config", ["config", "config-e20"])
    shipped = load_config(Path(__file__).resolve().parents[2] / "configs" / "fashion_mnist.yaml", [])
    config, longer = candidates["config"], candidates["config-e20"]
    for dotted, value in config.items():
        section, name = dotted.split(".")
        assert getattr(getattr(shipped, section), name) == value, dotted
    assert {"labeler.prior", "labeler.reg_m", "labeler.relax_bound"} <= set(config)
    assert shipped.method.task_weight == shipped.method.known_reweight == 0.0
    assert not any(dotted.startswith("method.") for dotted in config)
    assert longer == {**config, "optim.epochs": 20} and shipped.optim.epochs == 10
    assert quality.dataset_config("fashion-cached", None).optim.epochs == 10


#: the splits of the tiny caches below: ``{split: (views, labels)}``, 2 known and 2 novel classes
TINY_CACHE = {"known": (3, [0, 1, 0, 1, 1, 0]), "novel": (3, [2, 3, 3, 2, 2, 3]), "test": (1, [0, 1, 2, 3])}


def _two_block_cache(folder) -> str:
    """A tiny tiny_cnn activation cache of the input of its last TWO blocks (``[16, 16, 16]`` at 32 px; 3 views)."""
    return write_activation_cache(folder, TINY_CACHE, num_known=2, shape=(16, 16, 16), cached_blocks=2)


def test_the_two_block_variants_train_one_more_block_than_their_twins_on_the_same_cache(tmp_path, one_torch_thread):
    """``uno-b2`` / ``ncdlr-uniform-relax-b2`` (session 31) are ``uno`` / ``ncdlr-uniform-relax`` with
    ``model.trainable_blocks`` 2 and nothing else changed. On one two-block cache the twins train the last block
    only (the block before it stays at its initial weights) and the b2 variants train both."""
    from ncdlr.data.features import read_feature_table
    from ncdlr.service.local import train

    quality = load_benchmark("quality")
    splits = read_feature_table(_two_block_cache(tmp_path / "cache"))
    initial = _initial_block(1)
    for one, two in (("uno", "uno-b2"), ("ncdlr-uniform-relax", "ncdlr-uniform-relax-b2")):
        edits_one, edits_two = quality.VARIANTS[one], quality.VARIANTS[two]
        assert edits_two["model"] == {**edits_one.get("model", {}), "trainable_blocks": 2}
        assert {k: v for k, v in edits_two.items() if k != "model"} == {k: v for k, v in edits_one.items() if k != "model"}
        first = {}
        for variant in (one, two):
            cfg = quality.variant_config("openclipart-cached", variant, 0, splits, 1)
            cfg.data.batch_size = 4
            run = train(cfg, splits)
            assert cfg.model.cached_blocks == 2 and cfg.model.trainable_blocks == (2 if variant == two else 1)
            blocks = run.model.encoder.backbone.blocks
            first[variant] = [p.detach().clone() for p in blocks[1].parameters()]
            assert all(p.requires_grad for p in blocks[2].parameters())
            assert all(p.requires_grad == (variant == two) for p in blocks[1].parameters())
        # the twins start from the same (seeded) weights: only the two-block run moved the block before the last
        assert all(torch.equal(a, b) for a, b in zip(first[one], initial))
        assert any(not torch.equal(a, b) for a, b in zip(first[two], initial))


def _initial_block(index: int) -> list[torch.Tensor]:
    """tiny_cnn's block ``index`` as a two-block cache's encoder starts it (its seeded initial weights)."""
    from ncdlr.models import build_encoder

    encoder = build_encoder("tiny_cnn", trainable_blocks=2, image_size=32, cached_blocks=2)
    return [p.detach() for p in encoder.backbone.blocks[index].parameters()]


def test_the_imprint_variants_differ_from_their_twins_only_in_the_head_init(tmp_path, one_torch_thread):
    """``uno-imprint`` / ``ncdlr-uniform-relax-imprint`` (session 32) are ``uno`` / ``ncdlr-uniform-relax`` with
    ``model.head_init imprint``; each trains locally on a one-block cache."""
    from ncdlr.data.features import read_feature_table
    from ncdlr.service.local import train

    quality = load_benchmark("quality")
    splits = read_feature_table(write_activation_cache(tmp_path / "cache", TINY_CACHE, num_known=2))
    for one in ("uno", "ncdlr-uniform-relax"):
        edits_one, edits_two = quality.VARIANTS[one], quality.VARIANTS[f"{one}-imprint"]
        assert edits_two["model"] == {**edits_one.get("model", {}), "head_init": "imprint"}
        assert {k: v for k, v in edits_two.items() if k != "model"} == {k: v for k, v in edits_one.items() if k != "model"}
        cfg = quality.variant_config("openclipart-cached", f"{one}-imprint", 0, splits, 1)
        cfg.data.batch_size = 4
        assert cfg.model.head_init == "imprint" and cfg.model.head == "linear"
        assert train(cfg, splits).model.head.net.weight.isfinite().all()


def test_the_class_balanced_variant_is_the_configs_setting_with_the_known_rows_reweighted(tmp_path, one_torch_thread):
    """``ncdlr-uniform-relax-cb`` (session 33) is ``ncdlr-uniform-relax`` with ``method.known_reweight 1``; it trains
    locally on a one-block cache, and its known loss weighs the rows by their classes (a run differs from its twin)."""
    from ncdlr.data.features import read_feature_table
    from ncdlr.service.local import train

    quality = load_benchmark("quality")
    twin, balanced = quality.VARIANTS["ncdlr-uniform-relax"], quality.VARIANTS["ncdlr-uniform-relax-cb"]
    assert balanced == {**twin, "method": {"known_reweight": 1.0}}
    cache = {**TINY_CACHE, "known": (3, [0, 0, 0, 0, 0, 0, 1, 1])}  # class 0 three times as common as class 1
    splits = read_feature_table(write_activation_cache(tmp_path / "cache", cache, num_known=2))
    weights = {}
    for variant in ("ncdlr-uniform-relax", "ncdlr-uniform-relax-cb"):
        cfg = quality.variant_config("openclipart-cached", variant, 0, splits, 1)
        cfg.data.batch_size = 4
        run = train(cfg, splits)
        weights[variant] = run.model.head.net.weight.detach().clone()
        assert weights[variant].isfinite().all()
    assert run.method.known_class_weights is not None and run.method.known_reweight == 1.0
    assert not torch.allclose(weights["ncdlr-uniform-relax"], weights["ncdlr-uniform-relax-cb"])


def unequal_known_cache(folder) -> str:
    """:data:`TINY_CACHE` with unequal known training counts (6 and 2 rows), as the OpenClipart-LT config's
    ``labeler.relax_bound known`` needs (the bound is the known classes' n_max/n_min)."""
    return write_activation_cache(folder, {**TINY_CACHE, "known": (3, [0, 0, 0, 0, 0, 0, 1, 1])}, num_known=2)


def test_the_model_seed_variants_pin_the_prototypes_and_the_head_while_the_run_seed_follows_the_cell(tmp_path,
                                                                                                   one_torch_thread):
    """``…-m0`` / ``…-m3`` (session 55) are the OpenClipart-LT config's setting with ``model.prototype_seed`` pinned
    and nothing else changed. A cell of seed s gets run seed s and model seed 0 or 3 (every other variant: both s).
    Trained on one cache, ``-m3`` at run seed 0 starts from seed 3's ETF and head and ends apart from seed 0's run,
    and ``-m0`` at run seed 0 is the plain variant's seed-0 run to the bit."""
    from ncdlr.data.features import read_feature_table
    from ncdlr.service.local import train

    quality = load_benchmark("quality")
    base = "ncdlr-uniform-relax-task-cb-bound"
    for pinned in (0, 3):
        assert quality.VARIANTS[f"{base}-m{pinned}"] == {**quality.VARIANTS[base], "model": {"prototype_seed": pinned}}
    splits = read_feature_table(unequal_known_cache(tmp_path / "cache"))

    def seeds_of(variant: str) -> tuple[int, int]:  # (run seed, model seed) of the variant's cell of seed 2
        cfg = quality.variant_config("openclipart-cached", variant, 2, splits, 1)
        return cfg.run.seed, cfg.model.prototype_seed

    assert [seeds_of(v) for v in (base, f"{base}-m0", f"{base}-m3")] == [(2, 2), (2, 0), (2, 3)]
    runs = {}
    for variant in (base, f"{base}-m0", f"{base}-m3"):
        cfg = quality.variant_config("openclipart-cached", variant, 0, splits, 1)
        cfg.data.batch_size = 4
        run = train(cfg, splits)
        runs[variant] = (run.model.prototypes.clone(), run.model.head.net.weight.detach().clone())
    assert all(torch.equal(a, b) for a, b in zip(runs[base], runs[f"{base}-m0"]))
    assert not torch.equal(runs[base][0], runs[f"{base}-m3"][0])
    assert not torch.allclose(runs[base][1], runs[f"{base}-m3"][1])


def test_the_teacher_variant_is_the_config_with_a_mean_teacher_and_trains_on_an_activation_cache(tmp_path,
                                                                                                one_torch_thread):
    """``…-t05`` and ``…-t2`` (session 56) are the OpenClipart-LT config's setting with ``optim.teacher_epochs`` 0.5
    or 2 and nothing else changed; on a tiny activation cache (a trained conv block) ``…-t05`` trains through the
    local loop, apart from the plain variant's run of the same seed."""
    from ncdlr.data.features import read_feature_table
    from ncdlr.service.local import train

    quality = load_benchmark("quality")
    base = "ncdlr-uniform-relax-task-cb-bound"
    assert quality.VARIANTS[f"{base}-t05"] == {**quality.VARIANTS[base], "optim": {"teacher_epochs": 0.5}}
    assert quality.VARIANTS[f"{base}-t2"] == {**quality.VARIANTS[base], "optim": {"teacher_epochs": 2.0}}
    splits = read_feature_table(unequal_known_cache(tmp_path / "cache"))
    heads = {}
    for variant in (base, f"{base}-t05"):
        cfg = quality.variant_config("openclipart-cached", variant, 0, splits, 1)
        assert cfg.optim.teacher_epochs == (0.5 if variant.endswith("t05") else 0.0)
        cfg.data.batch_size = 4
        heads[variant] = train(cfg, splits).model.head.net.weight.detach().clone()
    assert not torch.allclose(heads[base], heads[f"{base}-t05"])


def test_the_buffer_length_variants_change_only_the_buffer_of_the_config():
    """``…-j2048`` (session 52) and ``…-j256`` (session 56) are the OpenClipart-LT config's setting with another
    ``labeler.buffer_size`` and nothing else."""
    quality = load_benchmark("quality")
    base = quality.VARIANTS["ncdlr-uniform-relax-task-cb-bound"]
    for rows in (2048, 256):
        variant = quality.VARIANTS[f"ncdlr-uniform-relax-task-cb-bound-j{rows}"]
        assert variant == {**base, "labeler": {**base["labeler"], "buffer_size": rows}}
