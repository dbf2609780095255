"""UNO's photometric augmentation of the training views (``data.photometric uno``, ``ncdlr embed --photometric``):
a function of its own stream, applied after the crop and flip, leaving the boxes and flips of ``none``; refused
where it cannot run (device decoding) and for unknown names."""

from __future__ import annotations

import numpy as np
import pytest

from ncdlr.data.pipeline import PipelineConfig
from ncdlr.data.transforms import (
    CachedViews,
    TrainViews,
    colour_stream,
    image_seed,
    photometric_view,
)
from ncdlr.service.config import ConfigError, load_config
from tests.fixtures.tiny_images import jpeg_bytes

SIZE = 24


def _batch(n: int = 5) -> dict:
    rng = np.random.default_rng(0)
    colours = [(200, 40, 40), (40, 200, 40), (40, 40, 200), (200, 200, 40), (120, 60, 200)]
    return {"image": np.array([jpeg_bytes(rng, 40, colours[i % 5]) for i in range(n)], dtype=object),
            "label": np.arange(n, dtype=np.int32),
            "source_id": np.array([f"img{i}" for i in range(n)], dtype=object)}


def _crop(size: int = SIZE) -> np.ndarray:
    rng = np.random.default_rng(1)
    return rng.integers(0, 256, (size, size, 3), dtype=np.uint8)


def test_a_photometric_view_is_a_function_of_its_stream_and_keeps_shape_and_dtype():
    crop = _crop()
    a = photometric_view(crop, np.random.default_rng(5))
    b = photometric_view(crop, np.random.default_rng(5))
    assert a.shape == crop.shape and a.dtype == np.uint8
    assert np.array_equal(a, b)
    assert np.array_equal(crop, _crop()), "the input crop is not modified"


def test_over_many_draws_about_half_the_views_are_jittered_and_some_are_grey():
    """With probabilities 0.5 (jitter), 0.1 (greyscale), 0.2 (blur): of 400 draws on one colourful crop, about 60 %
    change at all (1 − 0.5·0.9·0.8 = 0.64) and about 10 % come out with three equal channels."""
    crop = _crop()
    rng = np.random.default_rng(0)
    outs = [photometric_view(crop, rng) for _ in range(400)]
    changed = np.mean([not np.array_equal(o, crop) for o in outs])
    grey = np.mean([np.array_equal(o[..., 0], o[..., 1]) and np.array_equal(o[..., 1], o[..., 2]) for o in outs])
    assert 0.55 < changed < 0.73, changed
    assert 0.05 < grey < 0.16, grey


def test_uno_train_views_are_the_none_views_after_the_photometric_step_of_the_colour_stream():
    """Switching it on leaves every box and flip where it was: the ``uno`` views are ``photometric_view`` of the
    ``none`` views, drawn from :func:`colour_stream` of each image's stream."""
    batch = _batch()
    plain = TrainViews(size=SIZE, seed=3, dtype="uint8")(batch)
    colour = TrainViews(size=SIZE, seed=3, dtype="uint8", photometric="uno")(batch)
    seqs = np.random.SeedSequence(3).spawn(len(batch["image"]))
    for i, seq in enumerate(seqs):
        stream = colour_stream(seq)
        for name in ("view1", "view2"):
            expected = photometric_view(plain[name][i].transpose(1, 2, 0), stream)
            assert np.array_equal(colour[name][i].transpose(1, 2, 0), expected), (i, name)
    assert not all(np.array_equal(plain[n], colour[n]) for n in ("view1", "view2"))


def test_uno_cached_views_are_the_none_views_after_the_photometric_step_and_differ_somewhere():
    batch = _batch()
    plain = CachedViews(size=SIZE, views=4, seed=2)(batch)["views"]
    colour = CachedViews(size=SIZE, views=4, seed=2, photometric="uno")(batch)["views"]
    assert colour.shape == plain.shape == (5, 4, 3, SIZE, SIZE)
    for i, source_id in enumerate(batch["source_id"]):
        stream = colour_stream(image_seed(2, source_id))
        for v in range(4):
            expected = photometric_view(plain[i, v].transpose(1, 2, 0), stream)
            assert np.array_equal(colour[i, v].transpose(1, 2, 0), expected), (i, v)
    assert not np.array_equal(plain, colour)


def test_photometric_is_refused_with_device_decoding_and_unknown_names_are_refused():
    with pytest.raises(ValueError, match="decode_on 'device'.*use decode_on host"):
        PipelineConfig(photometric="uno", decode_on="device")
    with pytest.raises(ValueError, match="photometric must be one of"):
        TrainViews(photometric="strong")
    with pytest.raises(ValueError, match="photometric must be one of"):
        CachedViews(photometric="strong")
    with pytest.raises(ConfigError, match=r"data\.photometric"):
        load_config(None, ["--data.photometric", "strong"])
    assert load_config(None, ["--photometric", "uno"]).data.photometric == "uno"
    with pytest.raises(ConfigError, match=r"data\.photometric 'uno' .*data\.decode_on 'hybrid'"):
        load_config(None, ["--photometric", "uno", "--decode-on", "hybrid"])


def test_plain_train_views_keep_the_streams_they_had_before_the_colour_stream_existed():
    """Image ``i`` of a ``seed``'s batch still crops from ``default_rng(seed).spawn(n)[i]`` (the construction before
    ``photometric`` existed), so ``none`` views are bit-identical to earlier runs'."""
    from ncdlr.data.transforms import augmented_view, decode_rgb, detail_side

    batch = _batch()
    got = TrainViews(size=SIZE, seed=9, dtype="uint8")(batch)
    for i, rng in enumerate(np.random.default_rng(9).spawn(len(batch["image"]))):
        image = decode_rgb(batch["image"][i], min_side=detail_side(SIZE, (0.5, 1.0)))
        first = augmented_view(image, SIZE, (0.5, 1.0), 0.5, rng)
        second = augmented_view(image, SIZE, (0.5, 1.0), 0.5, rng)
        assert np.array_equal(got["view1"][i].transpose(1, 2, 0), first), i
        assert np.array_equal(got["view2"][i].transpose(1, 2, 0), second), i
