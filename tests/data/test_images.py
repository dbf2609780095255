"""Image helpers: decodability check, transparency flattening, content crop, lossless PNG."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from ncdlr.data.images import clipart_to_rgb, decode_problem, encode, encode_png, flatten_onto_white
from tests.fixtures.datasets import jpeg, truncated


def _png(image: Image.Image) -> bytes:
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def test_decode_problem_accepts_good_images_and_names_bad_ones() -> None:
    good = jpeg(np.random.default_rng(0), size=64)
    assert decode_problem(good) is None
    assert decode_problem(_png(Image.new("RGBA", (5, 5)))) is None
    assert "truncated" in decode_problem(truncated(good))
    assert decode_problem(b"") == "empty file"
    assert decode_problem(b"GIF89a not really").startswith(("UnidentifiedImageError", "SyntaxError", "OSError"))


def test_transparent_pixels_become_white_and_half_alpha_blends() -> None:
    pixels = np.zeros((1, 3, 4), dtype=np.uint8)
    pixels[0, 1] = (0, 0, 0, 255)
    pixels[0, 2] = (0, 0, 0, 128)
    flat = np.asarray(flatten_onto_white(Image.fromarray(pixels, "RGBA")))
    assert flat[0, 0].tolist() == [255, 255, 255]
    assert flat[0, 1].tolist() == [0, 0, 0]
    assert 120 <= flat[0, 2, 0] <= 135


def test_clipart_is_cropped_to_its_drawing_and_flattened() -> None:
    canvas = np.zeros((40, 50, 4), dtype=np.uint8)
    canvas[5:15, 10:30] = (200, 30, 30, 255)
    out = clipart_to_rgb(_png(Image.fromarray(canvas, "RGBA")))
    assert out.mode == "RGB" and out.size == (20, 10)
    assert np.all(np.asarray(out) == (200, 30, 30))


def test_palette_transparency_is_honoured() -> None:
    canvas = np.zeros((20, 20, 4), dtype=np.uint8)
    canvas[2:8, 2:6] = (0, 0, 255, 255)
    palette = Image.fromarray(canvas, "RGBA").quantize(colors=4)
    assert palette.mode == "P"
    out = clipart_to_rgb(_png(palette))
    assert out.size == (4, 6)


def test_clipart_shrinks_to_max_side_but_never_enlarges() -> None:
    big = _png(Image.new("RGBA", (300, 150), (10, 20, 30, 255)))
    assert clipart_to_rgb(big, max_side=100).size == (100, 50)
    assert clipart_to_rgb(big, max_side=1000).size == (300, 150)


def test_fully_transparent_clipart_is_refused() -> None:
    with pytest.raises(ValueError, match="fully transparent"):
        clipart_to_rgb(_png(Image.new("RGBA", (8, 8), (0, 0, 0, 0))))


def test_png_is_lossless_and_jpeg_is_opaque_rgb() -> None:
    pixels = np.random.default_rng(1).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(encode_png(pixels)))), pixels)
    assert Image.open(io.BytesIO(encode(Image.fromarray(pixels), "JPEG"))).mode == "RGB"
    with pytest.raises(ValueError, match="image_format"):
        encode(Image.fromarray(pixels), "GIF")
