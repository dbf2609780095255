"""The augmented activation cache: an encoder split at a block, activation tables, cached-view batches, the
step on cached activations against the image-mode step, ``embed --trainable-blocks`` (resumable) and a
``train --features`` run on a cache."""

from __future__ import annotations

import json
import shutil
import warnings

import numpy as np
import pytest
import torch

from ncdlr.buffer import LocalBuffer, epoch_capped_rows
from ncdlr.data.features import FeatureTableError, first_view, read_feature_table, write_table_part
from ncdlr.methods import build_method
from ncdlr.models import build_encoder, build_model
from ncdlr.service.config import Config
from ncdlr.service.run_data import model_for_table
from ncdlr.service.train_loop import PairedBatch, build_worker_state, feature_batches, train_step
from tests.fixtures.activation_caches import write_activation_cache

KS, KU = 2, 2


def _encoder(name: str, blocks: int, size: int, cached: int = 0):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # timm without weights warns (by design)
        return build_encoder(name, trainable_blocks=blocks, image_size=size, cached_blocks=cached)


@pytest.mark.parametrize("name,size,blocks", [("tiny_cnn", 32, 1), ("tiny_cnn", 32, 2), ("efficientnet_lite0", 64, 1),
                                              ("efficientnet_lite0", 64, 3), ("vit_tiny_patch16_224", 224, 1)])
def test_tail_of_stem_equals_the_whole_encoder(name, size, blocks):
    """``tail(stem(x)) == forward(x)`` in eval and in train mode (the frozen part drops nothing in train mode), with
    the stem run as ``ncdlr embed`` runs it (passes of ``pass_rows(size)`` images, which ``forward`` on a CPU uses
    too) and, with ``frozen_pass_rows = 0``, in one plain pass on both sides."""
    from ncdlr.models.batching import fixed_passes, pass_rows

    torch.manual_seed(0)
    whole = _encoder(name, blocks, size)
    cached = _encoder(name, blocks, size, cached=blocks)
    cached.load_state_dict(whole.state_dict())
    x = torch.randn(3, 3, size, size)
    assert whole.frozen_pass_rows == pass_rows(size)
    for rows in (pass_rows(size), 0):
        whole.frozen_pass_rows = rows
        for mode in (False, True):
            whole.train(mode)
            cached.train(mode)
            with torch.no_grad():
                activations = (fixed_passes(lambda part: whole.stem(part, blocks), x, rows) if rows
                               else whole.stem(x, blocks))
                torch.manual_seed(1)
                expected = whole(x)
                torch.manual_seed(1)
                got = cached(activations)
            assert torch.equal(got, expected), (name, blocks, mode, rows)


def test_an_encoder_without_a_split_and_a_block_count_out_of_range_are_refused():
    lite = _encoder("efficientnet_lite0", 1, 64)
    with pytest.raises(ValueError, match="has 16"):
        lite.stem(torch.zeros(1, 3, 64, 64), 17)
    with pytest.raises(ValueError, match="only those can be trained"):
        _encoder("tiny_cnn", 2, 32, cached=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        resnet = build_encoder("resnet18", trainable_blocks=1)
    with pytest.raises(ValueError, match="cannot be split"):
        resnet.stem(torch.zeros(1, 3, 32, 32), 1)


def _image_config() -> Config:
    cfg = Config()
    cfg.model.encoder, cfg.model.trainable_blocks, cfg.model.head = "efficientnet_lite0", 1, "linear"
    cfg.data.image_size, cfg.data.batch_size = 64, 4
    cfg.labeler.gamma, cfg.labeler.buffer_size = 5.0, 16
    cfg.optim.epochs, cfg.optim.warmup_epochs = 2, 1
    return cfg


def _state(cfg: Config, model):
    method = build_method(cfg.method, cfg.labeler, model.num_novel)
    method.connect(buffer=LocalBuffer(cfg.labeler.buffer_size, model.num_novel, "cpu"))
    return build_worker_state(cfg.optim, model, method, 10, torch.device("cpu"))


@pytest.mark.parametrize("method", ["ncdlr", "uno"])
def test_a_step_on_cached_activations_equals_the_image_step_on_the_same_crops(method):
    """The step ``ncdlr train --features CACHE`` takes equals the image-mode step on the crops the cache holds:
    same losses and the same gradient of every trainable parameter (float tolerance)."""
    cfg = _image_config()
    if method == "uno":
        cfg.method.name, cfg.model.prototypes, cfg.labeler.prior, cfg.labeler.use_buffer = "uno", "learnable", "uniform", False
    torch.manual_seed(0)
    image_model = build_model(cfg.model, KS, KU, image_size=64)
    cfg.model.cached_blocks = 1
    cached_model = build_model(cfg.model, KS, KU, image_size=64)
    cached_model.load_state_dict(image_model.state_dict())
    gen = torch.Generator().manual_seed(3)
    crops = [torch.randn(4, 3, 64, 64, generator=gen) for _ in range(4)]  # known v1, v2, novel v1, v2
    with torch.no_grad():  # what embed runs: the frozen stem in eval mode
        activations = [image_model.encoder.eval().stem(c, 1) for c in crops]
    labels, valid = torch.tensor([0, 1, 1, 0]), torch.ones(4, dtype=torch.bool)
    stats = []
    for model, views in ((image_model, crops), (cached_model, activations)):
        state = _state(cfg, model)
        stats.append(train_step(state, PairedBatch(views[0], views[1], labels, valid, views[2], views[3], valid), cfg.optim))
    for key in ("loss", "loss_s", "loss_u"):
        assert stats[1][key] == pytest.approx(stats[0][key], rel=1e-5, abs=1e-6), key
    grads = {n: p.grad for n, p in image_model.named_parameters() if p.requires_grad}
    assert grads and all(g is not None for g in grads.values())
    for name, param in cached_model.named_parameters():
        if param.requires_grad:
            torch.testing.assert_close(param.grad, grads[name], rtol=1e-4, atol=1e-6, msg=name)


# ---- activation tables -----------------------------------------------------------------------------------------

META = {"num_known": KS, "num_novel": KU, "encoder": "tiny_cnn", "pretrained": "", "image_size": 32,
        "cached_blocks": 1, "shape": [32, 8, 8], "views": {"known": 3, "novel": 3, "test": 1}}
NAMES = ["a", "b", "c", "d"]


def _write_cache(folder, views: int = 3, seed: int = 0, nan_row: int | None = None):
    """A ``[V, 32, 8, 8]`` cache of 2 known and 2 novel classes, its rows written in reverse source-id order."""
    parts = {"known": (views, [0, 1, 0, 1, 1]), "novel": (views, [2, 3, 3, 2]), "test": (1, [0, 1, 2, 3])}
    return write_activation_cache(folder, parts, num_known=KS, seed=seed, reverse_ids=True, nan_row=nan_row)


def test_an_activation_table_reads_as_float16_views_in_source_id_order(tmp_path):
    splits = read_feature_table(_write_cache(tmp_path / "cache"))
    assert splits.is_activations and splits.activation_shape == (32, 8, 8) and splits.dim == 0
    assert splits.features["known"].shape == (5, 3, 32, 8, 8) and splits.features["known"].dtype == torch.float16
    assert splits.features["test"].shape == (4, 1, 32, 8, 8) and splits.views("novel") == 3
    assert splits.source_ids["known"] == sorted(splits.source_ids["known"])
    assert splits.labels["known"].tolist() == [1, 1, 0, 1, 0]  # written in reverse id order
    assert first_view(splits.features["test"]).dtype == torch.float32
    with pytest.raises(ValueError, match="estimate the number of novel classes on a head-only table"):
        splits.labeled_rows()


def test_bad_activation_tables_are_refused_naming_the_problem(tmp_path):
    """NaN in a view, a row with another number of views, a missing kind/shape in the metadata."""
    with pytest.raises(FeatureTableError, match=r"NaN or infinite values in 1 rows \(first: row \d of split 'novel'"):
        read_feature_table(_write_cache(tmp_path / "nan", nan_row=2))
    folder = _write_cache(tmp_path / "ragged")
    write_table_part(f"{folder}/part-extra.parquet", np.zeros((1, 2, 32, 8, 8), np.float16), np.array([0]), ["known"],
                     source_ids=["known/zz.jpg"], class_names=NAMES, metadata=META)
    with pytest.raises(FeatureTableError, match="split 'known' has rows with 2 and 3 views"):
        read_feature_table(folder)
    import pyarrow as pa
    import pyarrow.parquet as pq

    bare = pa.table({"activation": pa.array([[0.0] * 4], type=pa.list_(pa.float16())), "label": [0], "split": ["known"]})
    pq.write_table(bare, tmp_path / "bare.parquet")
    with pytest.raises(FeatureTableError, match="needs metadata kind 'activations' and the activation 'shape'"):
        read_feature_table(str(tmp_path / "bare.parquet"))


def test_the_model_follows_the_table_and_contradictions_are_refused(tmp_path):
    splits = read_feature_table(_write_cache(tmp_path / "cache"))
    cfg = Config()
    cfg.model.encoder = "identity"
    model_for_table(cfg, splits)
    assert (cfg.model.encoder, cfg.model.cached_blocks, cfg.data.image_size) == ("tiny_cnn", 1, 32)
    for key, value, message in (("encoder", "efficientnet_lite0", "holds 'tiny_cnn' activations"),
                                ("trainable_blocks", 2, "last 1 block"), ("trainable_blocks", -1, "last 1 block"),
                                ("pretrained", "/w.pth", "pretrained")):
        cfg = Config()
        cfg.model.encoder = "tiny_cnn"
        setattr(cfg.model, key, value)
        with pytest.raises(ValueError, match=message):
            model_for_table(cfg, splits)
    one_view = read_feature_table(_write_cache(tmp_path / "one", views=1))
    with pytest.raises(ValueError, match="two different views"):
        model_for_table(_identity(), one_view)


def test_the_bare_command_trains_an_mlp_head_on_a_cache_as_on_a_head_only_table(tmp_path):
    """``train --features URI`` without a config trains a trainable ``mlp`` head on an activation cache too, not
    image mode's ``auto`` (identity at width ≥ K - 1): measured on OpenClipart-LT, the identity head cost ncdlr 5.7
    novel and 4.5 known points (results.md, session 63). A config file's head is left as the file says."""
    from ncdlr.service.config import resolve
    from ncdlr.service.entry import feature_table_settings
    from tests.fixtures.tiny_runs import write_tiny_table

    for table in (_write_cache(tmp_path / "cache"), write_tiny_table(tmp_path / "t.parquet")):
        cfg = resolve(feature_table_settings(table, None))
        splits = read_feature_table(table)
        model_for_table(cfg, splits)
        model = build_model(cfg.model, splits.num_known, splits.num_novel, image_size=cfg.data.image_size)
        assert cfg.model.head == "mlp" and model.head.kind == "mlp"
        assert any(p.requires_grad for p in model.head.parameters())
    # the last table is head-only, so its encoder stays the identity; image mode's default is another head
    assert cfg.model.encoder == "identity" and Config().model.head == "auto"
    assert [s.key for s in feature_table_settings("t.parquet", "configs/openclipart.yaml")] == ["data.features"]


def _identity() -> Config:
    cfg = Config()
    cfg.model.encoder = "identity"
    return cfg


def test_cached_batches_take_two_different_views_of_each_image(tmp_path):
    splits = read_feature_table(_write_cache(tmp_path / "cache"))
    cfg = Config()
    cfg.data.batch_size = 2
    batches = list(feature_batches(splits, cfg.data, seed=0, epoch=0, rank=0, world=1))
    assert len(batches) == 2
    cache = splits.features["novel"].float()
    for batch in batches:
        for v1, v2 in zip(batch.novel_view1, batch.novel_view2):
            i1 = [(i, j) for i in range(len(cache)) for j in range(3) if torch.equal(cache[i, j], v1)]
            i2 = [(i, j) for i in range(len(cache)) for j in range(3) if torch.equal(cache[i, j], v2)]
            assert len(i1) == len(i2) == 1 and i1[0][0] == i2[0][0] and i1[0][1] != i2[0][1]
        assert batch.novel_view1.dtype == torch.float32
    again = list(feature_batches(splits, cfg.data, seed=0, epoch=0, rank=0, world=1))
    assert all(torch.equal(a.known_view2, b.known_view2) for a, b in zip(batches, again))


# ---- embed and train, through Ray ------------------------------------------------------------------------------

@pytest.fixture
def prepared(tmp_path):
    from ncdlr.data.shards import write_dataset
    from tests.fixtures.tiny_images import make_tiny_dataset

    records, classes, info = make_tiny_dataset(train_counts=(12, 6, 10, 8), test_per_class=3, size=32)
    write_dataset(str(tmp_path / "data"), records, classes, info, progress=False)
    return str(tmp_path / "data"), len(records)


@pytest.mark.slow
def test_embed_caches_views_and_resumes_to_the_same_table(ray_local, prepared, tmp_path):
    from ncdlr.service.embed import embed_activations

    data, rows = prepared
    out = str(tmp_path / "cache")
    kwargs = dict(encoder="tiny_cnn", image_size=32, blocks=1, views=3, batch_size=8, rows_per_part=6, progress=False)
    stats = embed_activations(data, out, **kwargs)
    assert stats["rows"] == rows and stats["bad_images"] == 0 and stats["shape"] == [32, 8, 8]
    whole = read_feature_table(out)
    assert whole.views("known") == 3 and whole.views("test") == 1
    views = whole.features["novel"].float()
    assert not torch.equal(views[:, 0], views[:, 1])  # different crops of one image
    parts = sorted(p for p in (tmp_path / "cache").iterdir())
    for part in parts[:2]:  # as if interrupted before these parts were written
        part.unlink()
    again = embed_activations(data, out, **kwargs)
    assert again["skipped"] > 0 and again["skipped"] + again["rows"] == rows
    resumed = read_feature_table(out)
    for split in whole.features:
        assert torch.equal(resumed.features[split], whole.features[split]), split
        assert resumed.source_ids[split] == whole.source_ids[split]
    with pytest.raises(ValueError, match="made with other settings .*views"):
        embed_activations(data, out, **{**kwargs, "views": 4})
    with pytest.raises(ValueError, match="made with other settings .*photometric: 'none' there, 'uno' now"):
        embed_activations(data, out, **{**kwargs, "photometric": "uno"})
    # UNO's colour augmentation on the same boxes and flips: recorded in the table, set on a run's config from it
    colour_out = str(tmp_path / "colour")
    assert embed_activations(data, colour_out, **{**kwargs, "photometric": "uno"})["rows"] == rows
    colour = read_feature_table(colour_out)
    assert colour.metadata["photometric"] == "uno" and whole.metadata["photometric"] == "none"
    assert colour.source_ids["novel"] == whole.source_ids["novel"]
    assert not torch.equal(colour.features["novel"], whole.features["novel"])
    assert torch.equal(colour.features["test"], whole.features["test"])  # the centre view is never augmented
    cfg = Config()
    cfg.model.encoder = "identity"
    model_for_table(cfg, colour)
    assert cfg.data.photometric == "uno"
    with pytest.raises(ValueError, match="at least 2"):
        embed_activations(data, str(tmp_path / "one"), **{**kwargs, "views": 1})


@pytest.mark.slow
def test_embed_gives_the_same_bits_whatever_the_batching_and_the_actors(ray_local, prepared, tmp_path):
    """A real efficientnet_lite0 stem (32 px): batches of 8 rows on one actor, or of 5 rows on two actors (other
    block boundaries, rows in another order), write the same table to the bit; the table records the pass size."""
    from ncdlr.data.features import read_metadata
    from ncdlr.service.embed import embed_activations

    data, rows = prepared
    kwargs = dict(encoder="efficientnet_lite0", image_size=32, blocks=1, views=3, rows_per_part=10, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # timm without weights warns (by design)
        first = embed_activations(data, str(tmp_path / "a"), batch_size=8, num_actors=1, **kwargs)
        second = embed_activations(data, str(tmp_path / "b"), batch_size=5, num_actors=2, **kwargs)
    assert first["rows"] == second["rows"] == rows and first["pass_rows"] == 64
    a, b = read_feature_table(str(tmp_path / "a")), read_feature_table(str(tmp_path / "b"))
    for split in a.features:
        assert torch.equal(a.features[split], b.features[split]), split
        assert a.source_ids[split] == b.source_ids[split]
    assert read_metadata(str(tmp_path / "a"))["pass_rows"] == 64
    with pytest.raises(ValueError, match="pass-rows -1"):
        embed_activations(data, str(tmp_path / "c"), pass_rows=-1, **kwargs)


@pytest.mark.slow
def test_train_on_an_activation_cache_runs_and_evaluates(ray_local, prepared, tmp_path):
    """``ncdlr train --features CACHE`` (Ray Train, one CPU worker): the table's encoder and blocks, a finished run.
    It trains two heads (``model.heads``; one run covers both paths, the suite's time being short): the buffer actor
    holds both heads' columns, the checkpoint both labelers and the selected head, and the run is evaluated through
    that head. (One head's state dict and step: ``tests/methods/test_heads.py``.) The driver bounds the buffer by
    ``labeler.buffer_epochs`` from the pool's size before the actor is made (``prepare_run``): the config and the
    checkpointed buffer hold the capped rows."""
    heads = 2
    from ncdlr.service.config import Setting, resolve
    from ncdlr.service.embed import embed_activations
    from ncdlr.service.trained_run import open_run
    from ncdlr.service.trainer import fit

    data, _ = prepared
    cache = str(tmp_path / "cache")
    embed_activations(data, cache, encoder="tiny_cnn", image_size=32, blocks=1, views=3, batch_size=8, progress=False)
    cfg = resolve([Setting("data.features", cache), Setting("model.encoder", "identity"), Setting("model.head", "linear"),
                   Setting("data.batch_size", 4), Setting("optim.epochs", 2), Setting("labeler.buffer_size", 16),
                   Setting("run.output", str(tmp_path / "run")), Setting("model.heads", heads),
                   Setting("labeler.buffer_epochs", 0.25)])
    novel_rows = read_feature_table(cache).features["novel"].shape[0]
    capped = epoch_capped_rows(16, novel_rows // 4, 2 * 4, 0.25)
    assert capped < 16  # the cap bites on this pool
    result = fit(cfg)
    saved = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert result["test"]["all"] == saved["all"] and 0.0 <= saved["all"] <= 1.0
    config = (tmp_path / "run" / "config.yaml").read_text()
    assert "cached_blocks: 1" in config and "encoder: tiny_cnn" in config and f"heads: {heads}" in config
    run = open_run(tmp_path / "run")  # the run's last checkpoint, as evaluate / predict read it
    assert len(run.payload["extra_labelers"]) > 0
    assert run.payload["buffer"]["rows"].shape == (capped, heads * run.num_novel)  # both heads' columns, side by side
    assert f"buffer_size: {capped}" in config
    assert int(run.payload["model"]["selected_head"]) in (0, 1)
    shutil.rmtree(tmp_path / "run" / "ray", ignore_errors=True)


def test_a_validation_table_of_an_activation_cache_keeps_the_encoder_and_only_known_rows(tmp_path):
    """The γ search's validation problem from a cache (``build_validation_table``): an activation table of the
    known rows only, which trains with the cache's encoder."""
    from ncdlr.service.validation import ValidationConfig, build_validation_table

    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(4), [8, 6, 5, 4])
    folder = tmp_path / "cache"
    write_table_part(f"{folder}/part-0.parquet", rng.standard_normal((len(labels), 3, 32, 8, 8)).astype(np.float16),
                     labels, ["known"] * len(labels), source_ids=[f"k{i:03d}" for i in range(len(labels))],
                     class_names=[str(i) for i in range(6)], metadata={**META, "num_known": 4, "num_novel": 2})
    write_table_part(f"{folder}/part-1.parquet", np.zeros((2, 3, 32, 8, 8), np.float16), np.array([4, 5]),
                     ["novel"] * 2, source_ids=["n0", "n1"], class_names=[str(i) for i in range(6)],
                     metadata={**META, "num_known": 4, "num_novel": 2})
    info = build_validation_table(str(folder), str(tmp_path / "val.parquet"),
                                  ValidationConfig(pseudo_novel_fraction=0.5, min_pseudo_novel=2))
    table = read_feature_table(str(tmp_path / "val.parquet"))
    assert table.is_activations and table.metadata["encoder"] == "tiny_cnn" and table.views("val") == 3
    assert sum(info.split_counts.values()) == len(labels)  # every known row, no novel row
    cfg = _identity()
    model_for_table(cfg, table)
    assert cfg.model.encoder == "tiny_cnn" and cfg.model.cached_blocks == 1


def test_a_cache_written_before_the_photometric_key_resumes_as_none_and_refuses_uno(monkeypatch):
    """Caches made before ``embed --photometric`` existed have no such key: they were made without it, so a resume
    with ``none`` goes on and one with ``uno`` is refused naming the key."""
    from ncdlr.data import features, storage
    from ncdlr.service.embed import _check_resumable

    meta = {"encoder": "tiny_cnn", "pretrained": "", "image_size": 32, "cached_blocks": 1, "views": {"known": 3},
            "crop_scale": [0.5, 1.0], "seed": 0, "dataset": "d", "shape": [32, 8, 8]}
    monkeypatch.setattr(storage, "source_ids_under", lambda uri, endpoint_url=None: {"img0", "img1"})
    monkeypatch.setattr(features, "read_metadata", lambda uri, endpoint_url=None: dict(meta))
    assert _check_resumable("old", {**meta, "photometric": "none"}, None) == {"img0", "img1"}
    with pytest.raises(ValueError, match="photometric: 'none' there, 'uno' now"):
        _check_resumable("old", {**meta, "photometric": "uno"}, None)
