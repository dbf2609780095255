"""Image helpers for the dataset builders: decodability checks and the few re-encodings a builder may do.

Builders keep source bytes untouched (``ImageRecord.image`` is the JPEG/PNG exactly as in the source) except
where the source has no encoded image (CIFAR's pixel arrays, encoded here as lossless PNG) or the dataset
definition needs a pixel operation (OpenClipart: transparency flattened onto white, cropped to the drawn
content). Every function works on bytes or PIL images in memory; none touches files.
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image, ImageOps

# Errors PIL raises for bytes it cannot decode: truncated data (OSError), unknown format
# (UnidentifiedImageError, an OSError), broken headers (SyntaxError, ValueError, struct errors as
# ValueError/EOFError), absurd sizes (DecompressionBombError).
DECODE_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    SyntaxError,
    ValueError,
    EOFError,
    Image.DecompressionBombError,
)

WHITE = (255, 255, 255)


def decode_problem(data: bytes) -> str | None:
    """Why ``data`` cannot be decoded as an image, or ``None`` when it decodes.

    The whole compressed stream is decoded (a truncated JPEG fails here, where ``Image.verify`` alone
    would pass it). JPEGs are decoded at 1/8 scale through ``Image.draft`` — the DCT scaling still reads
    every entropy-coded block, at a fraction of the cost of a full decode. Images over PIL's
    decompression-bomb limit (``2 · Image.MAX_IMAGE_PIXELS``, ≈ 179 Mpx) count as undecodable.
    """
    if not data:
        return "empty file"
    try:
        with Image.open(io.BytesIO(data)) as image:
            if image.format == "JPEG":
                image.draft("RGB", (max(1, image.width // 8), max(1, image.height // 8)))
            image.load()
    except DECODE_ERRORS as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def pixel_count(data: bytes) -> int:
    """Width × height from the image header (nothing decoded)."""
    with Image.open(io.BytesIO(data)) as image:
        return image.width * image.height


def encode_png(pixels: np.ndarray) -> bytes:
    """Lossless PNG of an ``[H, W, 3]`` (or ``[H, W]``) uint8 array; deterministic for equal input."""
    if pixels.dtype != np.uint8 or pixels.ndim not in (2, 3):
        raise ValueError(f"expected a uint8 [H, W] or [H, W, 3] array, got {pixels.dtype} {pixels.shape}")
    return encode(Image.fromarray(pixels), "PNG")


def encode(image: Image.Image, image_format: str, *, jpeg_quality: int = 95) -> bytes:
    """Encode ``image`` as ``"PNG"`` (lossless, compression level 6) or ``"JPEG"`` (4:4:4 chroma)."""
    buffer = io.BytesIO()
    if image_format == "PNG":
        image.save(buffer, format="PNG", compress_level=6)
    elif image_format == "JPEG":
        image.convert("RGB").save(buffer, format="JPEG", quality=jpeg_quality, subsampling=0)
    else:
        raise ValueError(f"image_format must be 'PNG' or 'JPEG', got {image_format!r}")
    return buffer.getvalue()


def to_rgba(image: Image.Image) -> Image.Image:
    """``image`` as RGBA, honouring palette transparency (``P`` + ``tRNS``) and grey+alpha (``LA``)."""
    if image.mode == "RGBA":
        return image
    if image.mode == "P" and "transparency" in image.info:
        return image.convert("PA").convert("RGBA")
    return image.convert("RGBA")


def content_box(image: Image.Image) -> tuple[int, int, int, int] | None:
    """Bounding box ``(left, upper, right, lower)`` in pixels of the non-transparent pixels of an RGBA image.

    ``None`` when every pixel is fully transparent (nothing drawn).
    """
    return image.getchannel("A").getbbox()


def flatten_onto_white(image: Image.Image) -> Image.Image:
    """RGB image: the RGBA ``image`` alpha-composited over an opaque white background."""
    background = Image.new("RGBA", image.size, WHITE + (255,))
    return Image.alpha_composite(background, image).convert("RGB")


def clipart_to_rgb(data: bytes, *, max_side: int = 0) -> Image.Image:
    """Decode a (possibly transparent) clipart PNG into an opaque RGB image of its drawn content.

    Steps: apply any EXIF orientation, convert to RGBA, crop to the non-transparent box, shrink (never
    enlarge) so the longer side is at most ``max_side`` pixels when ``max_side > 0`` (Lanczos, which
    Pillow applies to premultiplied alpha, so edges keep no dark fringe), and flatten onto white.
    Raises ``ValueError`` when the image is fully transparent, and the ``DECODE_ERRORS`` for undecodable
    bytes. Peak memory ≈ 2 copies of the decoded RGBA image (4 bytes per pixel).
    """
    with Image.open(io.BytesIO(data)) as opened:
        opened.load()
        ImageOps.exif_transpose(opened, in_place=True)
        image = to_rgba(opened)
    box = content_box(image)
    if box is None:
        raise ValueError("image is fully transparent (nothing drawn)")
    image = image.crop(box)
    if max_side > 0 and max(image.size) > max_side:
        scale = max_side / max(image.size)
        size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
        image = image.resize(size, Image.Resampling.LANCZOS, reducing_gap=3.0)
    return flatten_onto_white(image)
