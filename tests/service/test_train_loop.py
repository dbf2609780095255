"""The per-worker loop as plain functions: global pseudo-labels, DDP ≡ single process, exact resume, checkpoints."""

from __future__ import annotations

import contextlib
import copy

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ncdlr.buffer import LocalBuffer
from ncdlr.labeler import AdaptiveSelfLabeler
from ncdlr.methods import Discovery
from ncdlr.models import build_model
from ncdlr.service.checkpoint import (CheckpointError, inference_state, load_checkpoint, restore_state, rng_state,
                                     save_state)
from ncdlr.service.config import Config
from ncdlr.data.features import read_feature_table, synthetic_features, write_feature_table
from ncdlr.data.storage import free_port
from ncdlr.service.local import local_state
from ncdlr.service.train_loop import PairedBatch, all_gather_rows, feature_batches, run_epoch, steps_per_epoch, train_step

KS, KU = 6, 6


def small_config(batch_size: int = 8) -> Config:
    cfg = Config()
    cfg.model.encoder, cfg.model.head = "identity", "mlp"
    cfg.data.batch_size = batch_size
    cfg.labeler.gamma, cfg.labeler.buffer_size = 5.0, 64
    cfg.optim.epochs, cfg.optim.warmup_epochs = 3, 1
    return cfg


@pytest.fixture(scope="module")
def splits(tmp_path_factory):
    x, y, s = synthetic_features(num_known=KS, num_novel=KU, dim=12, n_max=40, ratio=5, test_per_class=4, seed=1)
    path = tmp_path_factory.mktemp("features") / "table.parquet"
    write_feature_table(str(path), x, y, s, num_known=KS, num_novel=KU)
    return read_feature_table(str(path))


def new_state(cfg: Config, splits, world: int = 1):
    """A single-process state: the method built once, its discovery step on a :class:`LocalBuffer`."""
    torch.manual_seed(cfg.run.seed)
    cfg.model.feature_dim = splits.dim
    model = build_model(cfg.model, splits.num_known, splits.num_novel)
    steps = steps_per_epoch(splits.features["novel"].shape[0], cfg.data.batch_size, world)
    return local_state(cfg, model, steps)


def buffer_of(state) -> LocalBuffer:
    return state.method.discovery.buffer


def batches(splits, cfg: Config, epoch: int = 0, rank: int = 0, world: int = 1):
    return feature_batches(splits, cfg.data, cfg.run.seed, epoch, rank, world)


# ---- the step ------------------------------------------------------------------------------------------------

def test_a_step_gives_row_stochastic_labels_and_moves_tau(splits):
    cfg = small_config()
    state = new_state(cfg, splits)
    buffer = buffer_of(state)
    metrics = run_epoch(state, batches(splits, cfg), cfg.optim)
    assert metrics["steps"] == steps_per_epoch(splits.features["novel"].shape[0], 8, 1)
    assert state.labeler.imbalance_factor != pytest.approx(2.0)  # t starts at 0 (τ = 2) and moves
    assert len(buffer.buffer) == cfg.labeler.buffer_size
    assert 0 <= metrics["ot_share"] <= 1 and metrics["bad_images"] == 0


def test_known_warmup_trains_the_known_classes_alone_then_self_labeling_starts_on_a_fresh_clock(splits):
    """``optim.known_warmup_epochs``: no pseudo-labels, no novel loss, τ and the buffer untouched; then discovery
    starts with the buffer's clock at 0 (the Ray buffer client requires consecutive steps from 0)."""
    cfg = small_config()
    cfg.optim.known_warmup_epochs = 1.0
    state = new_state(cfg, splits)
    steps = steps_per_epoch(splits.features["novel"].shape[0], cfg.data.batch_size, 1)
    assert state.discovery_from == steps and state.discovery_step == -steps
    clock: list[int] = []
    targets = state.method.novel_targets_heads
    state.method.novel_targets_heads = lambda *args: (clock.append(args[-1]), targets(*args))[1]
    known_only = run_epoch(state, batches(splits, cfg), cfg.optim)
    assert known_only["loss_u"] == 0.0 and known_only["loss_s"] > 0 and known_only["ot_share"] == 0.0
    assert clock == [] and len(buffer_of(state).buffer) == 0
    assert state.tau_history == [pytest.approx(2.0)] * steps  # the prior waits at its start (t = 0)
    joint = run_epoch(state, batches(splits, cfg, 1), cfg.optim)
    assert clock == list(range(steps)) and state.discovery_step == steps
    assert joint["loss_u"] > 0 and state.labeler.imbalance_factor != pytest.approx(2.0)


@pytest.mark.parametrize("known_warmup", [0.0, 1.0])
def test_the_relaxations_warm_up_holds_the_sizes_for_its_epochs_of_self_labeling_then_relaxes(splits, known_warmup):
    """``labeler.relax_after_epochs = 1``: every solve of the first epoch of self-labeling (counted after a known-class
    warm-up) holds the sizes (κ = 1), every later one relaxes them by ``reg_m`` (κ = ρ / (ρ + ε) = 0.9)."""
    cfg = small_config()
    cfg.labeler.prior, cfg.labeler.reg_m, cfg.labeler.relax_after_epochs = "uniform", 0.45, 1.0
    cfg.optim.known_warmup_epochs = known_warmup
    state = new_state(cfg, splits)
    steps = steps_per_epoch(splits.features["novel"].shape[0], cfg.data.batch_size, 1)
    assert state.relax_from == steps
    kappas: list[float] = []
    targets = state.method.novel_targets_heads
    state.method.novel_targets_heads = lambda *args: (kappas.append(state.labeler.kappa), targets(*args))[1]
    for epoch in range(3):
        run_epoch(state, batches(splits, cfg, epoch), cfg.optim)
    discovery = 3 * steps - int(known_warmup * steps)
    assert kappas == [1.0] * steps + [pytest.approx(0.9)] * (discovery - steps)


def test_a_relax_bound_holds_the_sizes_from_the_epoch_after_the_one_that_ran_past_it_also_after_a_resume(
        splits, tmp_path):
    """``labeler.relax_bound``: the epoch's pseudo-label sizes (summed as ``clusters_empty`` / ``cluster_imbalance``)
    go to the labeler after each epoch; an epoch past the bound stops the relaxation, ``sizes_held_from_epoch``
    says from which epoch, and every later solve holds the sizes (κ = 1). A bound no epoch reaches changes nothing.
    The stop is in the checkpoint: a resumed run holds the sizes too."""
    cfg = small_config()
    cfg.labeler.prior, cfg.labeler.reg_m, cfg.labeler.relax_bound = "uniform", 0.45, "1.0001"
    state = new_state(cfg, splits)
    kappas: list[float] = []
    targets = state.method.novel_targets_heads
    state.method.novel_targets_heads = lambda *args: (kappas.append(state.labeler.kappa), targets(*args))[1]
    first = run_epoch(state, batches(splits, cfg, 0), cfg.optim)
    assert first["cluster_imbalance"] > 1.0001 and first["sizes_held_from_epoch"] == 2.0
    steps = len(kappas)
    second = run_epoch(state, batches(splits, cfg, 1), cfg.optim)
    assert "sizes_held_from_epoch" not in second  # said once, at the epoch that stopped it
    assert kappas == [pytest.approx(0.9)] * steps + [1.0] * steps
    save_state(tmp_path, state, buffer=buffer_of(state).state_dict(), rng=[rng_state()], config=cfg.to_dict())
    resumed = new_state(cfg, splits)
    assert not resumed.labeler.relax_stopped
    restore_state(resumed, load_checkpoint(tmp_path))
    assert resumed.labeler.relax_stopped and resumed.labeler.kappa == 1.0

    loose = small_config()
    loose.labeler.prior, loose.labeler.reg_m, loose.labeler.relax_bound = "uniform", 0.45, "1e9"
    bounded = new_state(loose, splits)
    plain_cfg = small_config()
    plain_cfg.labeler.prior, plain_cfg.labeler.reg_m = "uniform", 0.45
    plain = new_state(plain_cfg, splits)
    for epoch in range(2):
        a = run_epoch(bounded, batches(splits, loose, epoch), loose.optim)
        b = run_epoch(plain, batches(splits, plain_cfg, epoch), plain_cfg.optim)
        assert a["loss"] == b["loss"] and "sizes_held_from_epoch" not in a
    assert not bounded.labeler.relax_stopped


def test_relax_tighten_raises_reg_m_from_the_epoch_after_the_one_past_the_bound_also_after_a_resume(splits, tmp_path):
    """``labeler.relax_tighten 3``: the epoch past the bound reports ``sizes_tightened_from_epoch`` and the new ρ, and
    every later solve uses ρ = 1.35 (κ = 1.35 / 1.4), never the held sizes (κ = 1); the checkpoint keeps the factor."""
    cfg = small_config()
    cfg.labeler.prior, cfg.labeler.reg_m, cfg.labeler.relax_bound = "uniform", 0.45, "1.0001"
    cfg.labeler.relax_tighten = 3.0
    state = new_state(cfg, splits)
    kappas: list[float] = []
    targets = state.method.novel_targets_heads
    state.method.novel_targets_heads = lambda *args: (kappas.append(state.labeler.kappa), targets(*args))[1]
    first = run_epoch(state, batches(splits, cfg, 0), cfg.optim)
    assert first["sizes_tightened_from_epoch"] == 2.0 and first["reg_m_now"] == pytest.approx(1.35)
    assert "sizes_held_from_epoch" not in first
    steps = len(kappas)
    run_epoch(state, batches(splits, cfg, 1), cfg.optim)
    assert kappas == [pytest.approx(0.9)] * steps + [pytest.approx(1.35 / 1.4)] * steps
    assert not state.labeler.relax_stopped and state.labeler.reg_m_now == pytest.approx(4.05)  # the 2nd epoch ran past too
    save_state(tmp_path, state, buffer=buffer_of(state).state_dict(), rng=[rng_state()], config=cfg.to_dict())
    resumed = new_state(cfg, splits)
    restore_state(resumed, load_checkpoint(tmp_path))
    assert resumed.labeler.reg_m_now == pytest.approx(4.05) and not resumed.labeler.relax_stopped


def test_an_epoch_reports_how_many_clusters_its_pseudo_labels_left_empty(splits):
    """``clusters_empty`` / ``cluster_imbalance``: the epoch's hard pseudo-labels (both views, valid rows) counted
    per novel cluster, read from the targets the steps trained on; ``pseudo_label_confidence``: the same rows'
    mean largest target share; none of them in a known-class warm-up epoch."""
    from ncdlr.metrics import pseudo_label_sizes

    cfg = small_config()
    cfg.optim.known_warmup_epochs = 1.0
    state = new_state(cfg, splits)
    counts = torch.zeros(KU)
    tops: list[torch.Tensor] = []
    targets = state.method.novel_targets_heads

    def counted(views, z1, z2, valid, step):
        out, times = targets(views, z1, z2, valid, step)
        counts.add_(torch.bincount(out[0][:, valid].argmax(-1).flatten(), minlength=KU).float())
        tops.append(out[0][:, valid].amax(-1).flatten())
        return out, times

    state.method.novel_targets_heads = counted
    warmup = run_epoch(state, batches(splits, cfg), cfg.optim)
    assert "clusters_empty" not in warmup and "pseudo_label_confidence" not in warmup
    assert counts.sum() == 0 and state.cluster_counts is None and state.confidence_sum is None
    joint = run_epoch(state, batches(splits, cfg, 1), cfg.optim)
    expected = pseudo_label_sizes(counts.numpy())
    assert counts.sum() == 2 * joint["steps"] * cfg.data.batch_size  # every step's novel rows, two views
    assert joint["clusters_empty"] == expected["clusters_empty"]
    assert joint["cluster_imbalance"] == pytest.approx(expected["cluster_imbalance"])
    top = torch.cat(tops)
    assert top.numel() == counts.sum()
    assert joint["pseudo_label_confidence"] == pytest.approx(top.mean().item(), rel=1e-5)
    assert 1.0 / KU <= joint["pseudo_label_confidence"] <= 1.0
    assert state.cluster_counts is None and state.confidence_sum is None  # reset for the next epoch


def test_invalid_rows_are_left_out_of_the_ot_problem_and_counted():
    torch.manual_seed(0)
    scores = torch.randn(2, 6, KU).clamp(-1, 1)
    valid = torch.tensor([True, False, True, True, False, True])
    lab_a, lab_b = AdaptiveSelfLabeler(KU, gamma=5.0), AdaptiveSelfLabeler(KU, gamma=5.0)
    q, _ = Discovery(lab_a)(scores, valid, 0)
    expected = lab_b(scores[:, valid].reshape(-1, KU)).view(2, -1, KU)
    assert torch.allclose(q[:, valid], expected, atol=1e-6)
    assert torch.all(q[:, ~valid] == 0)
    assert torch.allclose(q[:, valid].sum(-1), torch.ones(2, 4), atol=1e-5)


def test_uint8_views_are_normalised_in_the_step_with_the_same_result():
    """A batch whose image views are still uint8 (``PairedBatches(normalise=False)``, what a GPU worker gets) takes
    the same step as the host-normalised float32 batch: same loss, same parameters after, with a padded row
    (zeros in both, as the host path has them; ``tiny_cnn``'s batch norm sees it). (Run on the CPU here;
    ``tests/test_gpu.py`` repeats it on a CUDA device.)"""
    from ncdlr.data.transforms import normalise_chw_torch

    cfg = small_config(batch_size=4)
    cfg.model.encoder, cfg.model.trainable_blocks, cfg.model.head = "tiny_cnn", -1, "linear"
    gen = torch.Generator().manual_seed(0)
    pixels = [torch.randint(0, 256, (4, 3, 16, 16), generator=gen, dtype=torch.uint8) for _ in range(4)]
    valid, labels = torch.tensor([True, True, True, False]), torch.tensor([0, 1, 2, 3])
    for p in pixels:  # the last row is padding for a dropped image: uint8 zeros before normalisation
        p[3] = 0
    floats = [normalise_chw_torch(p, "imagenet") for p in pixels]
    for f in floats:  # the host path's padding: zeros after normalisation (trainer._pad_side)
        f[3] = 0.0
    raw = PairedBatch(pixels[0], pixels[1], labels, valid, pixels[2], pixels[3], valid, scaling="imagenet")
    floats = PairedBatch(floats[0], floats[1], labels, valid, floats[2], floats[3], valid)

    def step(batch):
        torch.manual_seed(0)
        model = build_model(cfg.model, KS, KU, image_size=16)
        state = local_state(cfg, model, 4)
        return train_step(state, batch, cfg.optim), state

    (stats_raw, state_raw), (stats_float, state_float) = step(raw), step(floats)
    assert stats_raw["loss"] == stats_float["loss"]
    for a, b in zip(state_raw.model.parameters(), state_float.model.parameters()):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="need PairedBatch.scaling"):
        step(PairedBatch(*pixels[:2], labels, valid, *pixels[2:], valid))


@pytest.mark.parametrize("speed", ["channels_last", "compile"])
def test_step_speed_settings_take_the_same_step_as_the_plain_one(speed, monkeypatch):
    """``optim.channels_last`` and ``optim.compile`` change how the step runs, not what it computes: two steps
    give the losses and the gradients of the plain step (to float rounding: other kernels sum in other orders;
    parameters are not compared, as Adam turns a rounding-sized gradient into a step of size lr).
    Compiled here with the ``aot_eager`` backend (Dynamo's capture and AOTAutograd's joint graph, the parts our
    code can break, in 3 s instead of inductor's 40 s of C++ builds on 2 cores); bench_gpu.py times inductor on
    a GPU."""
    import functools

    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="aot_eager"))
    cfg = small_config(batch_size=4)
    cfg.model.encoder, cfg.model.trainable_blocks, cfg.model.head = "tiny_cnn", -1, "linear"
    gen = torch.Generator().manual_seed(0)
    views = [torch.randn(4, 3, 16, 16, generator=gen) for _ in range(4)]
    valid, labels = torch.ones(4, dtype=torch.bool), torch.tensor([0, 1, 2, 3])
    batch = PairedBatch(views[0], views[1], labels, valid, views[2], views[3], valid)

    def two_steps(config):
        torch.manual_seed(0)
        state = local_state(config, build_model(config.model, KS, KU, image_size=16), 4)
        return [train_step(state, batch, config.optim)["loss"] for _ in range(2)], state

    fast = copy.deepcopy(cfg)
    setattr(fast.optim, speed, True)
    (plain_losses, plain), (fast_losses, faster) = two_steps(cfg), two_steps(fast)
    assert (faster.forward is not None) == (speed == "compile")
    assert fast_losses == pytest.approx(plain_losses, rel=1e-4, abs=1e-5)
    for a, b in zip(plain.model.parameters(), faster.model.parameters()):
        assert torch.allclose(a.grad, b.grad, rtol=1e-3, atol=1e-5)


def test_image_batches_pad_dropped_rows_and_carry_the_scaling_of_uint8_views():
    """The trainer's adapter from ``PairedBatches`` steps to fixed-shape ``PairedBatch``es: a side that lost a row
    (an undecodable image) is padded back with an invalid zero row, and uint8 views keep their ``scaling`` (a GPU
    worker's ``PairedBatches(normalise=False)``); host-normalised steps carry none."""
    from ncdlr.service.worker import image_batches

    def side(rows: int, dtype: torch.dtype, scaling: bool) -> dict:
        out = {"view1": torch.ones(rows, 3, 4, 4, dtype=dtype), "view2": torch.ones(rows, 3, 4, 4, dtype=dtype),
               "label": torch.arange(rows), "source_id": [f"id{i}" for i in range(rows)]}
        if scaling:
            out["scaling"] = ["lite"] * rows
        return out

    raw, = image_batches([{"known": side(3, torch.uint8, True), "novel": side(4, torch.uint8, True)}], 4)
    assert raw.scaling == "lite" and raw.known_view1.dtype == torch.uint8
    assert raw.known_valid.tolist() == [True, True, True, False] and not raw.known_view1[3].any()
    assert raw.novel_valid.all()
    host, = image_batches([{"known": side(4, torch.float32, False), "novel": side(4, torch.float32, False)}], 4)
    assert host.scaling is None and host.known_view1.dtype == torch.float32
    with pytest.raises(ValueError, match="mixes normalisations"):
        mixed = side(4, torch.uint8, True)
        mixed["scaling"][0] = "imagenet"
        list(image_batches([{"known": mixed, "novel": side(4, torch.uint8, True)}], 4))


@pytest.mark.parametrize("mixup", [0.0, 0.4])
def test_bad_images_do_not_enter_the_losses(splits, mixup):
    """Rows marked invalid (undecodable images, zero views) change nothing, whatever their content (with mixup:
    nor do the mixed rows they were blended into)."""
    cfg = small_config()
    cfg.optim.mixup = mixup
    batch = next(batches(splits, cfg))
    batch.known_valid[:3] = False
    batch.novel_valid[-2:] = False
    garbage = PairedBatch(**batch.__dict__)
    for name in ("known_view1", "known_view2"):
        setattr(garbage, name, getattr(batch, name).clone())
        getattr(garbage, name)[:3] = 100.0
    for name in ("novel_view1", "novel_view2"):
        setattr(garbage, name, getattr(batch, name).clone())
        getattr(garbage, name)[-2:] = -100.0
    cfg.labeler.use_buffer = False
    a, b = new_state(cfg, splits), new_state(cfg, splits)
    stats_a, stats_b = train_step(a, batch, cfg.optim), train_step(b, garbage, cfg.optim)
    assert stats_a["bad_images"] == 5
    assert stats_a["loss"] == pytest.approx(stats_b["loss"], abs=1e-6)
    for p, q in zip(a.model.parameters(), b.model.parameters()):
        assert torch.allclose(p, q, atol=1e-6)


@pytest.mark.parametrize("method", ["ncdlr", "uno", "autonovel"])
def test_a_mixup_step_adds_the_mixed_rows_loss_and_leaves_the_clean_views_targets_alone(splits, method):
    """``optim.mixup``: the same batch gives the same clean losses and pseudo-labels (the OT problem, the buffer
    and τ see only the clean views) plus a positive mixed-rows term, and every method trains with it."""
    cfg = small_config()
    cfg.method.name = method
    if method != "ncdlr":
        cfg.model.prototypes, cfg.labeler.use_buffer, cfg.labeler.prior = "learnable", False, "uniform"
    batch = next(batches(splits, cfg))
    plain, mixed = new_state(cfg, splits), new_state(cfg, splits)
    mixed_cfg = copy.deepcopy(cfg)
    mixed_cfg.optim.mixup = 0.4
    a, b = train_step(plain, batch, cfg.optim), train_step(mixed, batch, mixed_cfg.optim)
    assert a["loss_mix"] == 0.0 and b["loss_mix"] > 0.0
    assert b["loss_s"] == pytest.approx(a["loss_s"]) and b["loss_u"] == pytest.approx(a["loss_u"])
    assert b["loss"] == pytest.approx(a["loss"] + b["loss_mix"], rel=1e-5)
    assert b["tau"] == pytest.approx(a["tau"])
    if method == "ncdlr":
        assert torch.equal(buffer_of(plain).buffer.rows, buffer_of(mixed).buffer.rows)
    metrics = run_epoch(mixed, batches(splits, mixed_cfg, epoch=1), mixed_cfg.optim)
    assert metrics["loss_mix"] > 0.0 and all(torch.isfinite(p).all() for p in mixed.model.parameters())


@pytest.mark.parametrize("method", ["ncdlr", "uno"])
def test_the_known_novel_term_adds_its_weighted_loss_and_leaves_the_pseudo_labels_alone(splits, method):
    """``method.task_weight``: the same batch gives the same known loss, novel loss and OT problem, plus the weight
    times the known-vs-novel cross-entropy of the valid rows of both views (recomputed here from the embeddings);
    weight 0 reports 0 and an epoch with it trains to finite weights."""
    from ncdlr.losses import known_novel_cross_entropy

    cfg = small_config()
    cfg.method.name = method
    if method != "ncdlr":
        cfg.model.prototypes, cfg.labeler.use_buffer, cfg.labeler.prior = "learnable", False, "uniform"
    batch = next(batches(splits, cfg))
    batch.novel_valid[-2:] = False
    plain, task = new_state(cfg, splits), new_state(cfg, splits)
    task.method.task_weight = 0.5  # as build_method sets it from method.task_weight (test below)
    with torch.no_grad():
        model = task.model
        k, n = batch.known_valid, batch.novel_valid
        z = torch.cat([model(batch.known_view1[k]), model(batch.known_view2[k]),
                       model(batch.novel_view1[n]), model(batch.novel_view2[n])])
        is_novel = torch.arange(z.shape[0]) >= 2 * int(k.sum())
        expected = 0.5 * known_novel_cross_entropy(z, model.class_prototypes(), model.num_known, is_novel)
    a, b = train_step(plain, batch, cfg.optim), train_step(task, batch, cfg.optim)
    assert a["loss_task"] == 0.0
    assert b["loss_task"] == pytest.approx(float(expected), rel=1e-4) and b["loss_task"] > 0.0
    assert b["loss_s"] == pytest.approx(a["loss_s"]) and b["loss_u"] == pytest.approx(a["loss_u"])
    assert b["loss"] == pytest.approx(a["loss"] + b["loss_task"], rel=1e-5)
    if method == "ncdlr":
        assert torch.equal(buffer_of(plain).buffer.rows, buffer_of(task).buffer.rows)
    metrics = run_epoch(task, batches(splits, cfg, epoch=1), cfg.optim)
    assert metrics["loss_task"] > 0.0 and all(torch.isfinite(p).all() for p in task.model.parameters())


def test_a_run_is_refused_a_negative_known_novel_weight():
    """The config refuses it before training starts, and the method layer refuses it on its own too."""
    from ncdlr.methods import build_method
    from ncdlr.methods.base import MethodConfigError
    from ncdlr.service.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="method.task_weight"):
        load_config(overrides=["--method.task_weight", "-0.1"])
    cfg = small_config()
    cfg.method.task_weight = 0.25
    assert build_method(cfg.method, cfg.labeler, num_novel=4).task_weight == 0.25
    cfg.method.task_weight = -0.1
    with pytest.raises(MethodConfigError, match="method.task_weight"):
        build_method(cfg.method, cfg.labeler, num_novel=4)


def test_a_mixup_run_is_refused_a_negative_beta_parameter():
    from ncdlr.service.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="optim.mixup"):
        load_config(overrides=["--optim.mixup", "-0.2"])
    assert load_config(overrides=["--mixup", "0.4"]).optim.mixup == 0.4


def beside_a_plain_run(splits, horizon_key: str):
    """A plain state and one whose ``optim.<horizon_key>`` (a moving average's horizon in epochs) is 0.5, from the
    same seed: ``(cfg, plain, cfg_with_it, state_with_it, decay)``, the decay ``1 − 1/(0.5 · steps per epoch)``."""
    cfg = small_config()
    plain = new_state(cfg, splits)
    other_cfg = copy.deepcopy(cfg)
    setattr(other_cfg.optim, horizon_key, 0.5)
    steps = steps_per_epoch(splits.features["novel"].shape[0], cfg.data.batch_size, 1)
    return cfg, plain, other_cfg, new_state(other_cfg, splits), 1 - 1 / (0.5 * steps)


def follow_by_hand(expected: dict, model, update: int, decay: float) -> None:
    """An ``AveragedModel``'s EMA of ``model``'s parameters by hand, in place: its first update copies, later ones
    mix in ``1 − decay`` of the iterate."""
    for n, p in model.named_parameters():
        expected[n] = p.detach().clone() if update == 0 else decay * expected[n] + (1 - decay) * p.detach()


def test_the_weights_moving_average_follows_every_step_and_leaves_training_alone(splits):
    """``optim.average_epochs`` H: the state keeps an exponential moving average of the weights with decay
    1 − 1/(H · steps per epoch), checked against the iterates by hand; training itself (losses, τ, the last
    iterate) is the same as without it, and ``averaged_model()`` is the average (the last iterate when off)."""
    cfg, plain, avg_cfg, averaged, decay = beside_a_plain_run(splits, "average_epochs")
    assert plain.average is None and plain.averaged_model() is plain.model
    expected = {n: p.detach().clone() for n, p in averaged.model.named_parameters()}
    for i, batch in enumerate(batches(splits, cfg)):
        if i == 3:
            break
        a, b = train_step(plain, batch, cfg.optim), train_step(averaged, batch, avg_cfg.optim)
        timings = ("ot_s", "exchange_s")
        assert {k: v for k, v in a.items() if k not in timings} == {k: v for k, v in b.items() if k not in timings}
        follow_by_hand(expected, averaged.model, i, decay)
    for (n, p), q in zip(plain.model.named_parameters(), averaged.model.parameters()):
        assert torch.equal(p, q), n
    mean = dict(averaged.averaged_model().named_parameters())
    for n, value in expected.items():
        torch.testing.assert_close(mean[n], value, rtol=1e-5, atol=1e-6)
    last = dict(averaged.model.named_parameters())
    assert any(not torch.equal(mean[n], last[n]) for n in last)  # three steps in, the average lags the iterate


def test_an_averaged_run_is_refused_a_negative_horizon():
    from ncdlr.service.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="optim.average_epochs"):
        load_config(overrides=["--optim.average_epochs", "-1"])
    assert load_config(overrides=["--average-epochs", "2"]).optim.average_epochs == 2.0


def test_the_mean_teacher_labels_the_novel_rows_and_follows_the_weights(splits):
    """``optim.teacher_epochs`` H: the discovery step solves the teacher's embeddings of the step's novel views
    (eval mode, no gradient), not the model's; the teacher is the initial model at the first step and an exponential
    moving average of the iterates with decay 1 − 1/(H · steps per epoch) after it (checked by hand); the model is
    what evaluation reads (``averaged_model()``), and the first step's labels are a plain run's, since both label
    with the same weights then (the head has no batch-dependent layer)."""
    cfg, plain, t_cfg, taught, decay = beside_a_plain_run(splits, "teacher_epochs")
    assert plain.teacher is None and taught.teacher is not None and taught.averaged_model() is taught.model
    seen: list[tuple] = []
    solve = taught.method.novel_targets_heads
    taught.method.novel_targets_heads = lambda views, z1, z2, *rest: (seen.append((views, z1, z2)),
                                                                       solve(views, z1, z2, *rest))[1]
    expected = {n: p.detach().clone() for n, p in taught.model.named_parameters()}
    for i, batch in enumerate(batches(splits, cfg)):
        if i == 3:
            break
        with torch.no_grad():
            z1, z2 = taught.teacher.module(batch.novel_view1), taught.teacher.module(batch.novel_view2)
        a, b = train_step(plain, batch, cfg.optim), train_step(taught, batch, t_cfg.optim)
        views, t1, t2 = seen[-1]
        assert views[0] is taught.teacher.module and torch.equal(t1[0], z1) and torch.equal(t2[0], z2)
        if i == 0:  # both label with the initial weights: the same step
            assert a["loss"] == pytest.approx(b["loss"], rel=1e-6)
        follow_by_hand(expected, taught.model, i, decay)
    teacher = dict(taught.teacher.module.named_parameters())
    for n, value in expected.items():
        torch.testing.assert_close(teacher[n], value, rtol=1e-5, atol=1e-6)
    last = dict(taught.model.named_parameters())
    assert any(not torch.equal(teacher[n], last[n]) for n in last)  # three steps in, the teacher lags the model
    assert any(not torch.equal(p, last[n]) for n, p in plain.model.named_parameters())  # and trains it elsewhere


def test_the_teacher_runs_in_eval_mode_and_leaves_the_model_training():
    """:func:`teacher_embeddings` reads batch-norm layers with the teacher's stored statistics (eval mode), touches
    no statistics, keeps no graph, and leaves the teacher in the mode it found it in; the embeddings come back per
    view, ``[H, B, D]``."""
    from ncdlr.service.train_loop import teacher_embeddings

    class Normed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm, self.proj = torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 3)

        def forward(self, x):
            return torch.nn.functional.normalize(self.proj(self.norm(x)), dim=-1)

    torch.manual_seed(0)
    teacher = Normed().train()
    teacher.norm.running_mean.fill_(5.0)
    stats = {n: b.clone() for n, b in teacher.named_buffers()}
    x = torch.randn(10, 4, requires_grad=True)
    views, t1, t2 = teacher_embeddings(teacher, x, heads=1, use_amp=False)
    assert views == [teacher] and t1.shape == t2.shape == (1, 5, 3) and not t1.requires_grad
    assert teacher.training and all(torch.equal(stats[n], b) for n, b in teacher.named_buffers())
    with torch.no_grad():
        eval_out = Normed.forward(teacher.eval(), x)
    assert torch.equal(torch.cat([t1[0], t2[0]]), eval_out)


def test_a_taught_run_is_refused_a_negative_horizon():
    from ncdlr.service.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="optim.teacher_epochs"):
        load_config(overrides=["--optim.teacher_epochs", "-0.5"])
    assert load_config(overrides=["--teacher-epochs", "0.5"]).optim.teacher_epochs == 0.5


# ---- distributed ≡ single process (gloo, two local processes, no Ray) -------------------------------------------

def pseudo_labels_without_side_effects(state, batch, cfg, step, rank):
    """This step's pseudo-labels ``[2, B, Ku]`` from copies of the labeler and buffer (the real ones stay untouched)."""
    scores = torch.stack([state.model(batch.novel_view1) @ state.model.novel_prototypes,
                          state.model(batch.novel_view2) @ state.model.novel_prototypes]).detach()
    labeler_copy = AdaptiveSelfLabeler(KU, gamma=5.0)
    labeler_copy.load_state_dict(state.labeler.state_dict())
    buffer, buffer_copy = buffer_of(state), LocalBuffer(cfg.labeler.buffer_size, KU)
    if len(buffer.buffer):
        buffer_copy.buffer.load_state_dict(buffer.buffer.state_dict())
    discovery = state.method.discovery
    q, _ = Discovery(labeler_copy, buffer_copy, discovery.gather, discovery.rank)(scores, batch.novel_valid, step)
    return q


@contextlib.contextmanager
def gloo_group(rank: int, world: int, port: int):
    """A spawned rank's gloo process group on loopback, one torch thread; destroyed on the way out."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _ddp_worker(rank: int, world: int, table: str, port: int, out_dir: str) -> None:
    from torch.nn.parallel import DistributedDataParallel

    with gloo_group(rank, world, port):
        splits = read_feature_table(table)
        cfg = small_config(batch_size=8)
        state = new_state(cfg, splits, world)
        state.forward = DistributedDataParallel(state.model)
        state.method.connect(buffer=LocalBuffer(cfg.labeler.buffer_size, KU), gather=all_gather_rows, rank=rank)
        taus = []
        labels = []
        for step, batch in enumerate(batches(splits, cfg, 0, rank, world)):
            if step == 4:
                break
            labels.append(pseudo_labels_without_side_effects(state, batch, cfg, step, rank))
            train_step(state, batch, cfg.optim)
            taus.append(state.labeler.imbalance_factor)
        torch.save({"taus": taus, "labels": labels, "model": state.model.state_dict(), "t": state.labeler.prior.t.detach()},
                   os.path.join(out_dir, f"rank{rank}.pt"))


def training_table(splits, directory) -> str:
    """The known and novel training rows of ``splits`` as a feature table the spawned ranks read."""
    table = str(directory / "table.parquet")
    write_feature_table(table, torch.cat([splits.features[s] for s in ("known", "novel")]).numpy(),
                        torch.cat([splits.labels[s] for s in ("known", "novel")]).numpy(),
                        ["known"] * len(splits.labels["known"]) + ["novel"] * len(splits.labels["novel"]),
                        num_known=KS, num_novel=KU)
    return table


def test_two_gloo_ranks_equal_one_process_on_the_concatenated_batch(splits, tmp_path):
    table = training_table(splits, tmp_path)

    mp.spawn(_ddp_worker, args=(2, table, free_port(), str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    assert ranks[0]["taus"] == ranks[1]["taus"]  # identical τ on every rank, bit for bit

    single = read_feature_table(table)
    cfg = small_config(batch_size=16)
    state = new_state(cfg, single, 1)
    for step, batch in enumerate(batches(single, cfg)):
        if step == 4:
            break
        q = pseudo_labels_without_side_effects(state, batch, cfg, step, 0)
        for rank in range(2):  # each rank's rows are its block of the single-process batch
            assert torch.allclose(ranks[rank]["labels"][step], q[:, rank * 8:(rank + 1) * 8], atol=1e-5)
        train_step(state, batch, cfg.optim)
    assert ranks[0]["t"].item() == pytest.approx(state.labeler.prior.t.item(), abs=1e-5)
    for name, value in state.model.state_dict().items():
        assert torch.allclose(ranks[0]["model"][name], value, atol=1e-5), name


def _ddp_heads_worker(rank: int, world: int, table: str, port: int, out_dir: str) -> None:
    from torch.nn.parallel import DistributedDataParallel

    with gloo_group(rank, world, port):
        splits = read_feature_table(table)
        cfg = small_config(batch_size=8 * 2 // world)
        cfg.model.heads, cfg.data.max_steps_per_epoch = 3, 4
        state = new_state(cfg, splits, world)
        if world > 1:
            state.forward = DistributedDataParallel(state.model)
        state.method.connect(buffer=LocalBuffer(cfg.labeler.buffer_size, 3 * KU), gather=all_gather_rows, rank=rank)
        metrics = run_epoch(state, batches(splits, cfg, 0, rank, world), cfg.optim)
        torch.save({"head": state.model.selected, "losses": [metrics[f"loss_u_head{h}"] for h in range(3)],
                    "t": [lab.prior.t.detach() for lab in state.method.labelers]},
                   os.path.join(out_dir, f"heads{world}-rank{rank}.pt"))


def test_two_gloo_ranks_choose_the_head_one_process_chooses(splits, tmp_path):
    """``model.heads = 3`` under DDP: every head's labeler moves identically on both ranks, and the epoch's head
    losses (reduced over the ranks) and the chosen head are those of one process on the concatenated batch."""
    table = training_table(splits, tmp_path)

    mp.spawn(_ddp_heads_worker, args=(2, table, free_port(), str(tmp_path)), nprocs=2, join=True)
    mp.spawn(_ddp_heads_worker, args=(1, table, free_port(), str(tmp_path)), nprocs=1, join=True)
    ranks = [torch.load(tmp_path / f"heads2-rank{r}.pt", weights_only=True) for r in range(2)]
    single = torch.load(tmp_path / "heads1-rank0.pt", weights_only=True)
    assert ranks[0]["head"] == ranks[1]["head"] == single["head"]
    assert ranks[0]["losses"] == ranks[1]["losses"] == pytest.approx(single["losses"], rel=1e-4)
    for a, b, c in zip(ranks[0]["t"], ranks[1]["t"], single["t"]):
        assert torch.equal(a, b) and a.item() == pytest.approx(c.item(), abs=1e-5)


# ---- checkpoints and exact resume -------------------------------------------------------------------------------

def _train(state, cfg, splits, epochs):
    history = []
    for _ in range(epochs):
        metrics = run_epoch(state, batches(splits, cfg, state.epoch), cfg.optim)
        history.append({k: metrics[k] for k in ("loss", "loss_s", "loss_u", "tau", "lr")})
    return history


@pytest.mark.parametrize("mixup, average, heads, relax, teacher",
                         [(0.0, 0.0, 1, False, 0.0), (0.4, 0.0, 1, False, 0.0), (0.0, 0.5, 1, False, 0.0),
                          (0.0, 0.5, 3, False, 0.0), (0.0, 0.0, 1, True, 0.0), (0.0, 0.0, 3, False, 0.5)])
def test_resume_after_k_epochs_equals_an_uninterrupted_run(splits, tmp_path, mixup, average, heads, relax, teacher):
    """With mixup too: each step's pairing is drawn from (seed, step, rank), so a resumed run pairs as before.
    With a moving average of the weights (``optim.average_epochs``) the average goes on where it stopped, and
    evaluation reads it from the checkpoint (``inference_state``). With several heads (``model.heads``) every
    head's labeler and the selected head come back too. With the relaxation's warm-up (``relax``: sizes held for
    the first 7 steps, relaxed from the 8th, inside the resumed epochs) the resumed run switches at the same step.
    With a mean teacher (``optim.teacher_epochs``, here with three heads) the teacher goes on where it stopped."""
    cfg = small_config()
    cfg.optim.mixup, cfg.optim.average_epochs, cfg.model.heads = mixup, average, heads
    cfg.optim.teacher_epochs = teacher
    cfg.data.max_steps_per_epoch = 5
    if relax:
        cfg.labeler.reg_m = 0.45
        cfg.labeler.relax_after_epochs = 7 / steps_per_epoch(splits.features["novel"].shape[0], cfg.data.batch_size, 1)
    full = new_state(cfg, splits)
    full_history = _train(full, cfg, splits, 3)

    first = new_state(cfg, splits)
    history = _train(first, cfg, splits, 1)
    save_state(tmp_path, first, buffer=buffer_of(first).state_dict(), rng=[rng_state()], config=cfg.to_dict())
    torch.manual_seed(123)  # a restarted process has other RNG and init state
    resumed = new_state(cfg, splits)
    buffer_of(resumed).buffer.load_state_dict(restore_state(resumed, load_checkpoint(tmp_path)))
    history += _train(resumed, cfg, splits, 2)
    full_buffer, resumed_buffer = buffer_of(full), buffer_of(resumed)

    assert history == full_history
    assert torch.equal(resumed_buffer.buffer.rows, full_buffer.buffer.rows)
    assert torch.equal(resumed.labeler.prior.t, full.labeler.prior.t)
    for a, b in zip(full.method.extra_labelers, resumed.method.extra_labelers, strict=True):
        assert torch.equal(a.prior.t, b.prior.t)
    assert resumed.model.selected == full.model.selected and resumed.method.active_head == full.method.active_head
    for (name, a), b in zip(full.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), name
    assert resumed.tau_history == full.tau_history
    if average:
        for (name, a), b in zip(full.averaged_model().state_dict().items(), resumed.averaged_model().state_dict().values()):
            assert torch.equal(a, b), name
        assert int(resumed.average.n_averaged) == full.step
        save_state(tmp_path / "end", resumed, buffer=None, rng=[rng_state()], config=cfg.to_dict())
        exported = inference_state(load_checkpoint(tmp_path / "end"))
        averaged = dict(resumed.averaged_model().named_parameters())
        assert all(torch.equal(exported[n], averaged[n]) for n in averaged if averaged[n].requires_grad)
        assert not all(torch.equal(exported[n], p) for n, p in resumed.model.named_parameters() if p.requires_grad)
    else:
        assert "average" not in load_checkpoint(tmp_path)
    if teacher:
        for (name, a), b in zip(full.teacher.module.state_dict().items(), resumed.teacher.module.state_dict().values()):
            assert torch.equal(a, b), name
        assert int(resumed.teacher.n_averaged) == full.step
    else:
        assert "teacher" not in load_checkpoint(tmp_path)


def test_a_teacher_resumed_from_a_checkpoint_without_one_starts_from_the_restored_weights(splits, tmp_path):
    """A run given ``optim.teacher_epochs`` on resume from a checkpoint written without a teacher: the teacher
    starts as the restored model (not the new process's initial weights), so the first resumed step's labels come
    from the trained weights; the next update copies the model again (``n_averaged`` 0)."""
    cfg = small_config()
    cfg.data.max_steps_per_epoch = 5
    first = new_state(cfg, splits)
    _train(first, cfg, splits, 1)
    save_state(tmp_path, first, buffer=None, rng=[rng_state()], config=cfg.to_dict())
    taught_cfg = copy.deepcopy(cfg)
    taught_cfg.optim.teacher_epochs = 0.5
    torch.manual_seed(123)
    resumed = new_state(taught_cfg, splits)
    restore_state(resumed, load_checkpoint(tmp_path))
    assert int(resumed.teacher.n_averaged) == 0
    for (name, a), b in zip(first.model.state_dict().items(), resumed.teacher.module.state_dict().values()):
        assert torch.equal(a, b), name


def test_checkpoint_loads_with_weights_only(splits, tmp_path):
    cfg = small_config()
    state = new_state(cfg, splits)
    _train(state, cfg, splits, 1)
    path = save_state(tmp_path, state, buffer=buffer_of(state).state_dict(), rng=[rng_state()], config=cfg.to_dict())
    payload = torch.load(path, weights_only=True)
    assert payload["epoch"] == 1 and payload["step"] == state.step
    assert "prototypes" in payload["model"] and "_extra_state" in str(payload["labeler"].keys())
    assert payload["buffer"]["rows"].shape == (cfg.labeler.buffer_size, KU)


def test_checkpoint_for_another_model_is_refused_naming_the_file(splits, tmp_path):
    cfg = small_config()
    state = new_state(cfg, splits)
    save_state(tmp_path, state, buffer=None, rng=[rng_state()], config=cfg.to_dict())
    other = Config()
    other.model.encoder, other.model.head, other.model.feature_dim = "identity", "linear", splits.dim
    model = build_model(other.model, KS, KU)
    wrong = local_state(other, model, 10)
    with pytest.raises(CheckpointError, match="state.pt"):
        restore_state(wrong, load_checkpoint(tmp_path))


@pytest.mark.parametrize("saved, loaded", [(1, 3), (3, 1), (3, 2)])
def test_a_checkpoint_of_another_number_of_heads_is_refused(splits, tmp_path, saved, loaded):
    """``model.heads`` must match the run that wrote the checkpoint; the error names the file and the head keys."""
    cfg = small_config()
    cfg.model.heads = saved
    save_state(tmp_path, new_state(cfg, splits), buffer=None, rng=[rng_state()], config=cfg.to_dict())
    cfg.model.heads = loaded
    with pytest.raises(CheckpointError, match=r"state\.pt.*(extra_heads|selected_head)"):
        restore_state(new_state(cfg, splits), load_checkpoint(tmp_path))


def test_unknown_checkpoint_version_is_refused(tmp_path):
    torch.save({"format_version": 99}, tmp_path / "state.pt")
    with pytest.raises(CheckpointError, match="format version 99"):
        load_checkpoint(tmp_path)
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "missing")


def test_validation_scores_the_val_split_only(splits):
    from ncdlr.service.worker import validate

    cfg = small_config()
    state = new_state(cfg, splits)
    with_val = type(splits)({**splits.features, "val": splits.features["test"]},
                            {**splits.labels, "val": splits.labels["test"]}, KS, KU, splits.class_names)
    scores = validate(state, with_val)
    assert set(scores) == {"val_all", "val_known", "val_novel"}
    assert all(0.0 <= v <= 1.0 for v in scores.values())


def test_the_checkpoint_schedule_saves_every_epoch_or_on_its_interval_and_always_at_the_end():
    from ncdlr.service.worker import CheckpointSchedule

    assert [CheckpointSchedule(0.0, 4).due(e) for e in range(1, 5)] == [True] * 4
    hourly = CheckpointSchedule(3600.0, 4)
    assert [hourly.due(e) for e in range(1, 5)] == [False, False, False, True]
    hourly.since -= 3601  # an hour has passed since the last checkpoint
    assert hourly.due(2) and not hourly.due(3)  # saved, and the clock restarted
