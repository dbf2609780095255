"""The device-side input path (``ncdlr.data.device_views``) against the host path (``TrainViews``), on CPU tensors.

Both draw the same crop boxes and flips from the same seed for images the host decoder does not shrink, so
each view can be compared pixel by pixel: the two resamplers (PIL's antialiased bilinear, roi_align's averaged
bilinear samples) differ by about a grey level.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from ncdlr.data.device_views import DeviceTrainViews, decode_images, is_complete_jpeg, resized_crops
from ncdlr.data.transforms import DecodedImages, TrainViews, normalise_chw, random_resized_crop_box

SIZE = 32


def smooth_image(rng: np.random.Generator, width: int, height: int, fmt: str = "JPEG", mode: str = "RGB") -> bytes:
    """A photo-like image: a smooth, left-right asymmetric colour ramp plus noise (a wrong flip shows)."""
    x = np.linspace(0, 1, width)[None, :, None]
    y = np.linspace(0, 1, height)[:, None, None]
    phase = rng.uniform(0, 6, (1, 1, 3))
    pixels = 127 + 90 * np.sin(5 * x ** 2 + 3 * y + phase) + 15 * rng.standard_normal((height, width, 3))
    image = Image.fromarray(pixels.clip(0, 255).astype(np.uint8))
    if mode == "RGBA":
        alpha = np.full((height, width), 255, np.uint8)
        alpha[: height // 2] = 0  # top half transparent: flattened onto white
        image = Image.fromarray(np.dstack([np.asarray(image), alpha]), "RGBA")
    out = io.BytesIO()
    image.save(out, format=fmt, **({"quality": 95} if fmt == "JPEG" else {}))
    return out.getvalue()


def mixed_batch() -> list[bytes]:
    rng = np.random.default_rng(0)
    return [smooth_image(rng, 64, 48), smooth_image(rng, 40, 60), smooth_image(rng, 64, 48),
            smooth_image(rng, 50, 50, "PNG"), smooth_image(rng, 44, 52, "WEBP"), smooth_image(rng, 60, 44)]


def test_device_views_match_the_host_views_drawn_from_the_same_seed() -> None:
    data = mixed_batch()
    host = TrainViews(size=SIZE, seed=3, dtype="uint8")({"image": np.array(data, dtype=object)})
    views, valid = DeviceTrainViews(size=SIZE, seed=3).raw_views(data, "cpu")
    assert valid.all() and host["valid"].all()
    for v, name in enumerate(("view1", "view2")):
        diff = (torch.from_numpy(host[name]).float() - views[v]).abs().mean(dim=(1, 2, 3))
        assert diff.max() < 2.0, f"{name}: mean |device − host| per image {diff.tolist()} grey levels"


def test_the_same_boxes_and_flips_as_the_host_draw() -> None:
    sizes = [(48, 64), None, (60, 40)]
    boxes, flips = DeviceTrainViews(size=SIZE, seed=7, hflip_prob=0.5).boxes(sizes)
    rngs = np.random.default_rng(7).spawn(3)
    for i in (0, 2):
        h, w = sizes[i]
        for v in range(2):
            assert tuple(boxes[i, v]) == random_resized_crop_box(w, h, (0.5, 1.0), rngs[i])
            assert flips[i, v] == (rngs[i].random() < 0.5)
    assert not boxes[1].any() and not flips[1].any()


def test_normalised_views_are_the_raw_views_normalised_and_invalid_rows_zero() -> None:
    data = mixed_batch()[:3] + [b"not an image"]
    transform = DeviceTrainViews(size=SIZE, seed=1, scaling="lite")
    raw, valid = transform.raw_views(data, "cpu")
    out = transform(data, "cpu")
    assert valid.tolist() == [True, True, True, False] and torch.equal(out["valid"], valid)
    expected = torch.from_numpy(normalise_chw(raw[0, :3].round().to(torch.uint8).numpy(), "lite"))
    assert torch.allclose(out["view1"][:3], expected, atol=0.5 / 128 + 1e-6)
    assert out["view1"].dtype == torch.float32 and out["view1"].shape == (4, 3, SIZE, SIZE)
    assert not out["view1"][3].any() and not out["view2"][3].any()


def test_a_truncated_jpeg_fails_alone_and_the_rest_of_the_batch_decodes() -> None:
    data = mixed_batch()
    broken = data[0][: len(data[0]) // 3]
    images = decode_images([data[1], broken, data[2], b"", data[5]], "cpu")
    assert images[1] is None and images[3] is None
    assert [tuple(images[i].shape) for i in (0, 2, 4)] == [(3, 60, 40), (3, 48, 64), (3, 44, 60)]
    assert all(images[i].dtype == torch.uint8 for i in (0, 2, 4))


def test_png_transparency_is_flattened_onto_white_as_on_the_host() -> None:
    data = [smooth_image(np.random.default_rng(2), 40, 40, "PNG", mode="RGBA")]
    (image,) = decode_images(data, "cpu")
    assert not is_complete_jpeg(data[0])
    jpeg = mixed_batch()[0]
    assert is_complete_jpeg(jpeg) and not is_complete_jpeg(jpeg[: len(jpeg) // 2]), "a cut JPEG goes to PIL"
    assert (image[:, :20] == 255).all(), "the transparent top half becomes white"
    assert (image[:, 20:] < 255).any()


def test_resized_crops_of_the_whole_image_at_its_own_size_are_the_image() -> None:
    g = torch.Generator().manual_seed(0)
    images = [torch.randint(0, 256, (3, 16, 16), generator=g, dtype=torch.uint8),
              torch.randint(0, 256, (3, 20, 12), generator=g, dtype=torch.uint8)]
    boxes = torch.tensor([[0, 0, 16, 16], [0, 0, 12, 20]], dtype=torch.float32)
    out = resized_crops(images[:1], boxes[:1], torch.tensor([0]), 16)
    assert torch.allclose(out[0], images[0].float(), atol=1e-3)
    both = resized_crops(images, boxes, torch.tensor([0, 1]), 8)
    assert both.shape == (2, 3, 8, 8)
    alone = resized_crops(images[1:], boxes[1:], torch.tensor([0]), 8)
    assert torch.allclose(both[1], alone[0]), "grouping by image size does not change a crop"


def test_device_views_refuse_a_bad_scaling_or_crop_scale() -> None:
    with pytest.raises(ValueError, match="scaling"):
        DeviceTrainViews(scaling="rgb")
    with pytest.raises(ValueError, match="crop_scale"):
        DeviceTrainViews(crop_scale=(0.0, 1.0))


def test_hybrid_views_from_host_decoded_pixels_match_the_device_decoded_ones() -> None:
    """``decode_on="hybrid"``: ``DecodedImages`` (PIL in the read task) then ``of_pixels`` gives the views the
    all-device path gives from the bytes (same seed, same image sizes: same boxes and flips), and an unreadable
    image is invalid with zero views on both."""
    data = mixed_batch() + [b"\xff\xd8\xff broken"]
    decoded = DecodedImages(min_side=46)({"image": np.array(data, dtype=object), "label": np.arange(len(data)),
                                          "source_id": np.array([f"i{i}" for i in range(len(data))], dtype=object)})
    assert decoded["valid"].tolist() == [True] * 6 + [False]
    assert [p.shape for p in decoded["pixels"][:2]] == [(48, 64, 3), (60, 40, 3)] and set(decoded) == {
        "pixels", "valid", "label", "source_id"}
    transform = DeviceTrainViews(size=SIZE, seed=4)
    pixels = [torch.from_numpy(np.array(p)) for p in decoded["pixels"]]
    hybrid = transform.of_pixels(pixels, torch.from_numpy(decoded["valid"]), "cpu")
    device = transform(data, "cpu")
    assert torch.equal(hybrid["valid"], device["valid"])
    for view in ("view1", "view2"):
        diff = (hybrid[view] - device[view]).abs().mean(dim=(1, 2, 3)) * 255 * 0.226  # ≈ grey levels
        assert diff.max() < 2.0, diff
        assert not hybrid[view][6].any()
