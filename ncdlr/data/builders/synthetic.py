"""Synthetic long-tailed set, written as an iNaturalist-2018 release and prepared by the ``inat18`` builder.

Each class is one combination of a shape (8), a hue (12) and a fill texture (4) — up to 384 classes.
An image draws its class's shape at a random position, size and rotation, in the class hue (jittered in
hue, saturation and brightness), filled with the class texture at a random phase and orientation, over
a random low-saturation background, with a random distractor shape half of the time and Gaussian pixel
noise, saved as JPEG. A small CNN learns it; nearest-pixel matching does not.

Build, in two steps, so the iNat path runs end to end wherever this set is used:
  1. write ``train2018.json``, ``val2018.json`` and ``train_val2018/Synthetic/<category id>/<image id>.jpg``
     under ``source_dir`` (a temporary folder by default, removed afterwards);
  2. ``ncdlr.data.builders.inat18.build`` with all ``num_classes`` categories and the same seed.
Training counts are chosen knowing the inat18 class draw, so each half is an exact exponential tail:
the class with label ``l`` (rank ``c`` inside its half of size ``C``) has ``floor(n_max · R^(-c/(C-1)))``
training images; every class has ``test_per_class`` test images. Everything is a function of ``seed``.
Cost: ≈ 1 ms per 64-px image to draw; 10 classes at the defaults (354 images) build in about a second.
"""

from __future__ import annotations

import colorsys
import itertools
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

from ncdlr.data.builders import inat18
from ncdlr.data.builders.common import long_tail_targets, seeded_rng
from ncdlr.data.manifest import Manifest

SHAPES = ("circle", "square", "triangle", "diamond", "cross", "ring", "star", "hexagon")
HUES = tuple(f"hue{h:02d}" for h in range(12))
TEXTURES = ("solid", "stripes", "checks", "dots")
MAX_CLASSES = len(SHAPES) * len(HUES) * len(TEXTURES)
SUPERCATEGORY = "Synthetic"


@dataclass(frozen=True)
class SyntheticConfig:
    num_classes: int = 10  # K, 2..384
    ratio: float = 10.0  # R = head / tail training images inside each half
    n_max: int = 60  # training images of each half's head class
    test_per_class: int = 10  # test images per class (balanced, like iNat's val)
    image_size: int = 64  # side of the square images, pixels
    seed: int = 0  # seed of the class look, the images, the inat18 class draw and the row order
    jpeg_quality: int = 90
    name: str = ""  # default "synthetic-<K>"


@dataclass(frozen=True)
class ClassLook:
    shape: str
    hue: float  # 0..1
    texture: str

    @property
    def name(self) -> str:
        return f"{self.shape}-hue{round(self.hue * 12):02d}-{self.texture}"


def class_looks(num_classes: int, seed: int) -> list[ClassLook]:
    """Distinct (shape, hue, texture) per category id, a seeded sample of the 384 combinations."""
    if not 2 <= num_classes <= MAX_CLASSES:
        raise ValueError(f"num_classes must be in 2..{MAX_CLASSES}, got {num_classes}")
    combos = list(itertools.product(SHAPES, range(len(HUES)), TEXTURES))
    order = seeded_rng(seed, "looks").permutation(len(combos))[:num_classes]
    return [ClassLook(combos[i][0], combos[i][1] / len(HUES), combos[i][2]) for i in order]


def _polygon(shape: str, cx: float, cy: float, r: float, angle: float) -> list[tuple[float, float]]:
    if shape == "square":
        radii, n = [r] * 4, 4
    elif shape == "triangle":
        radii, n = [r] * 3, 3
    elif shape == "hexagon":
        radii, n = [r] * 6, 6
    elif shape == "diamond":
        radii, n = [r, 0.55 * r] * 2, 4
    elif shape == "star":
        radii, n = [r, 0.42 * r] * 5, 10
    elif shape == "cross":
        # 12 corners of a plus sign with arm half-width 0.35 r
        w = 0.35 * r
        pts = [(w, r), (w, w), (r, w), (r, -w), (w, -w), (w, -r),
               (-w, -r), (-w, -w), (-r, -w), (-r, w), (-w, w), (-w, r)]
        c, s = np.cos(angle), np.sin(angle)
        return [(cx + x * c - y * s, cy + x * s + y * c) for x, y in pts]
    else:
        raise ValueError(f"not a polygon shape: {shape}")
    angles = [angle + 2 * np.pi * k / n for k in range(n)]
    return [(cx + rad * np.cos(a), cy + rad * np.sin(a)) for a, rad in zip(angles, radii)]


def _mask(shape: str, size: int, cx: float, cy: float, r: float, angle: float) -> np.ndarray:
    """``[size, size]`` bool mask of the shape."""
    canvas = Image.new("L", (size, size), 0)
    draw = ImageDraw.Draw(canvas)
    if shape in ("circle", "ring"):
        draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=255)
        if shape == "ring":
            inner = 0.55 * r
            draw.ellipse((cx - inner, cy - inner, cx + inner, cy + inner), fill=0)
    else:
        draw.polygon(_polygon(shape, cx, cy, r, angle), fill=255)
    return np.asarray(canvas) > 127


def _rgb(hue: float, saturation: float, value: float) -> np.ndarray:
    return np.array(colorsys.hsv_to_rgb(hue % 1.0, saturation, value), dtype=np.float32) * 255


def _texture(texture: str, size: int, rng: np.random.Generator) -> np.ndarray:
    """``[size, size]`` bool: True where the fill uses its darker second tone."""
    y, x = np.mgrid[0:size, 0:size].astype(np.float32)
    period = size * rng.uniform(0.09, 0.14)
    theta = rng.uniform(0, np.pi)
    u = (x * np.cos(theta) + y * np.sin(theta)) / period + rng.uniform(0, 1)
    v = (-x * np.sin(theta) + y * np.cos(theta)) / period + rng.uniform(0, 1)
    if texture == "solid":
        return np.zeros((size, size), dtype=bool)
    if texture == "stripes":
        return (u % 1.0) < 0.5
    if texture == "checks":
        return (np.floor(u) + np.floor(v)) % 2 == 0
    if texture == "dots":
        return (u % 1.0 - 0.5) ** 2 + (v % 1.0 - 0.5) ** 2 < 0.09
    raise ValueError(f"unknown texture {texture}")


def render(look: ClassLook, size: int, rng: np.random.Generator) -> np.ndarray:
    """One ``[size, size, 3]`` uint8 image of class ``look``."""
    background = _rgb(rng.uniform(), rng.uniform(0.0, 0.25), rng.uniform(0.35, 0.95))
    image = np.broadcast_to(background, (size, size, 3)).copy()
    if rng.uniform() < 0.5:  # distractor: a small shape of random look
        d_mask = _mask(SHAPES[rng.integers(len(SHAPES))], size, *rng.uniform(0.1, 0.9, 2) * size,
                       rng.uniform(0.07, 0.13) * size, rng.uniform(0, 2 * np.pi))
        image[d_mask] = _rgb(rng.uniform(), rng.uniform(0.2, 0.9), rng.uniform(0.3, 0.95))
    r = rng.uniform(0.2, 0.34) * size
    cx, cy = rng.uniform(r, size - r, 2)
    mask = _mask(look.shape, size, cx, cy, r, rng.uniform(0, 2 * np.pi))
    hue = look.hue + rng.normal(0, 0.012)
    saturation, value = rng.uniform(0.55, 0.95), rng.uniform(0.6, 0.95)
    fill = np.where(_texture(look.texture, size, rng)[..., None], _rgb(hue, saturation, value * 0.45),
                    _rgb(hue, saturation, value))
    image[mask] = fill[mask]
    image += rng.normal(0, 8, image.shape)
    return np.clip(image, 0, 255).astype(np.uint8)


def train_counts_by_category(config: SyntheticConfig) -> list[int]:
    """Training images per category id, so that the inat18 draw sees an exact tail in each half."""
    ids = list(range(config.num_classes))
    known, novel = inat18.draw_classes(ids, config.num_classes, config.seed)
    targets = long_tail_targets(len(known), len(novel), config.n_max, config.ratio, config.ratio)
    counts = [0] * config.num_classes
    for label, category_id in enumerate(known + novel):
        counts[category_id] = targets[label]
    return counts


def write_inat_tree(config: SyntheticConfig, root: Path) -> Path:
    """Write the synthetic set as an iNat-2018 release under ``root``; returns ``root``."""
    looks = class_looks(config.num_classes, config.seed)
    train_counts = train_counts_by_category(config)
    root.mkdir(parents=True, exist_ok=True)
    categories = [
        {"id": cid, "name": look.name, "supercategory": SUPERCATEGORY} for cid, look in enumerate(looks)
    ]
    splits: dict[str, dict[str, list]] = {
        name: {"images": [], "annotations": [], "categories": categories}
        for name in (inat18.TRAIN_JSON, inat18.TEST_JSON)
    }
    image_id = 0
    for cid, look in enumerate(looks):
        folder = root / "train_val2018" / SUPERCATEGORY / str(cid)
        folder.mkdir(parents=True, exist_ok=True)
        rng = seeded_rng(config.seed, "synthetic-images", cid)
        for index in range(train_counts[cid] + config.test_per_class):
            split = inat18.TRAIN_JSON if index < train_counts[cid] else inat18.TEST_JSON
            file_name = f"train_val2018/{SUPERCATEGORY}/{cid}/{image_id:07d}.jpg"
            Image.fromarray(render(look, config.image_size, rng)).save(
                root / file_name, format="JPEG", quality=config.jpeg_quality
            )
            splits[split]["images"].append(
                {"id": image_id, "file_name": file_name, "width": config.image_size, "height": config.image_size}
            )
            splits[split]["annotations"].append({"id": image_id, "image_id": image_id, "category_id": cid})
            image_id += 1
    for name, content in splits.items():
        (root / name).write_text(json.dumps(content))
    return root


def build(
    config: SyntheticConfig,
    out_uri: str,
    *,
    source_dir: Path | None = None,
    progress: bool = True,
    **write_options: Any,
) -> Manifest:
    """Write the iNat-style tree (to ``source_dir``, kept, or a removed temporary folder), then prepare it."""

    def prepare(tree: Path) -> Manifest:
        inat_config = inat18.Inat18Config(
            root=tree,
            num_classes=config.num_classes,
            seed=config.seed,
            name=config.name or f"synthetic-{config.num_classes}",
            source=f"synthetic (ratio {config.ratio:g}, n_max {config.n_max}, {config.image_size}px) as iNat-2018 JSON",
        )
        return inat18.build(inat_config, out_uri, progress=progress, **write_options)

    if source_dir is not None:
        return prepare(write_inat_tree(config, Path(source_dir)))
    with tempfile.TemporaryDirectory(prefix="ncdlr-synthetic-") as tmp:
        return prepare(write_inat_tree(config, Path(tmp)))
