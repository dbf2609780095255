"""Decode and augment encoded images into the model's input views: plain functions on numpy batches.

``TrainViews`` turns each image into two independently augmented views (RandomResizedCrop with area scale
``crop_scale`` and aspect ratio 3/4–4/3, horizontal flip, with ``photometric="uno"`` UNO's colour jitter, greyscale
and blur (:func:`photometric_view`), normalisation); ``EvalView`` into one deterministic
view (resize the short side to ``resize`` px, centre crop ``size``). Both work on a batch dict with an
``image`` column of encoded bytes, as ``ray.data.Dataset.map_batches`` hands it over, and can be called on
their own (tests, notebooks, a DataLoader).

An image that cannot be decoded never raises: its row comes out with ``valid=False`` and all-zero views, so
the consumer can count it and log its ``source_id`` (``split_valid``); nothing is dropped silently.

Normalisation (``scaling``): ``"imagenet"`` → ``(x/255 − mean)/std`` with the ImageNet mean/std (timm and
torchvision encoders); ``"lite"`` → ``(x − 127)/128`` on the 0–255 value (efficientnet_lite0's training input).

Output format (``dtype``): ``"float32"`` (default) gives normalised float32 ``[N, 3, S, S]`` views. ``"uint8"``
gives the same crops as raw uint8 ``[N, 3, S, S]`` plus a ``scaling`` column (the name, one per row), 4× fewer
bytes; ``normalise_views`` turns such a batch into exactly the float32 batch ``"float32"`` would have given.
The Ray pipeline ships uint8 through the object store and normalises on the consumer
(``ncdlr.data.pipeline.to_torch``).
"""

from __future__ import annotations

import functools
import hashlib
import io
import logging
import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image, ImageFilter

log = logging.getLogger(__name__)

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
SCALINGS = ("imagenet", "lite")
VIEW_DTYPES = ("float32", "uint8")
VIEW_COLUMNS = ("view1", "view2", "image")  # the pixel columns the transforms write
CROP_RATIO = (3 / 4, 4 / 3)
PHOTOMETRIC = ("none", "uno")  # the training views' colour augmentation after the crop and flip

Batch = dict[str, Any]


def decode_rgb(data: bytes, min_side: int | None = None) -> Image.Image | None:
    """Decode encoded bytes to an RGB ``PIL.Image``; ``None`` when they are not a readable image.

    ``min_side``: let the JPEG decoder skip detail the crop will throw away (DCT scaling, ``Image.draft``),
    keeping both sides ≥ ``min_side``. Transparent images are flattened onto white.
    """
    try:
        image = Image.open(io.BytesIO(data))
        if min_side is not None and image.format == "JPEG":
            image.draft("RGB", (min_side, min_side))
        image.load()  # decode now: truncated/corrupt data raises here, not later
        if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
            rgba = image.convert("RGBA")
            white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
            return Image.alpha_composite(white, rgba).convert("RGB")
        return image.convert("RGB")
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError):
        return None


def _scale_and_shift(scaling: str) -> tuple[np.ndarray, np.ndarray]:
    """(scale, shift) such that normalised = uint8_value * scale + shift, per channel, shape [3, 1, 1]."""
    if scaling == "imagenet":
        std = np.array(IMAGENET_STD, dtype=np.float32) * 255.0
        mean = np.array(IMAGENET_MEAN, dtype=np.float32) * 255.0
        return (1.0 / std).reshape(3, 1, 1), (-mean / std).reshape(3, 1, 1)
    if scaling == "lite":
        return np.full((3, 1, 1), 1 / 128, np.float32), np.full((3, 1, 1), -127 / 128, np.float32)
    raise ValueError(f"scaling must be one of {SCALINGS}, got {scaling!r}")


def to_chw(pixels: np.ndarray) -> np.ndarray:
    """uint8 ``[N, H, W, 3]`` → contiguous uint8 ``[N, 3, H, W]``."""
    return np.ascontiguousarray(pixels.transpose(0, 3, 1, 2))


def normalise_chw(chw: np.ndarray, scaling: str) -> np.ndarray:
    """uint8 ``[N, 3, H, W]`` (may be read-only) → a new float32 ``[N, 3, H, W]``: ``x · scale + shift`` per channel.

    Two passes over the output and no float temporaries; the same float32 operations, hence the same bits,
    as ``x.astype(float32) * scale + shift``."""
    scale, shift = _scale_and_shift(scaling)
    out = np.multiply(chw, scale, dtype=np.float32)
    out += shift
    return out


def normalise_chw_torch(chw: Any, scaling: str) -> Any:
    """:func:`normalise_chw` for a uint8 torch tensor ``[N, 3, H, W]``, on the tensor's own device (e.g. the GPU,
    after a host-to-device copy of 4x fewer bytes than float32 views). The same two float32 roundings
    (``x · scale``, then ``+ shift``), so the same bits as the numpy version (tested)."""
    import torch

    if chw.dtype != torch.uint8 or chw.ndim != 4 or chw.shape[1] != 3:
        raise ValueError(f"need uint8 [N, 3, H, W] views, got {chw.dtype} {tuple(chw.shape)}")
    scale, shift = _scale_and_shift_on(scaling, chw.device)
    return chw.to(torch.float32).mul_(scale).add_(shift)


@functools.lru_cache(maxsize=16)
def _scale_and_shift_on(scaling: str, device: Any) -> tuple[Any, Any]:
    """:func:`_scale_and_shift` as torch tensors on ``device``, copied there once (not once per step)."""
    import torch

    return tuple(torch.from_numpy(a).to(device) for a in _scale_and_shift(scaling))


def batch_scaling(values: Any) -> str:
    """The one normalisation named by a batch's ``scaling`` column (``ValueError`` if it mixes several or is empty)."""
    names = {str(v) for v in values}
    if len(names) > 1:
        raise ValueError(f"one batch mixes normalisations {sorted(names)}: build every stream with one scaling")
    if not names:
        raise ValueError("an empty scaling column names no normalisation")
    return names.pop()


def normalise(pixels: np.ndarray, scaling: str) -> np.ndarray:
    """uint8 ``[N, H, W, 3]`` → float32 ``[N, 3, H, W]`` with the chosen normalisation."""
    return normalise_chw(to_chw(pixels), scaling)


def _finish(out: Batch, name: str, pixels: np.ndarray, valid: np.ndarray, scaling: str, dtype: str) -> None:
    """Put the ``[N, H, W, 3]`` uint8 ``pixels`` into ``out[name]`` in the requested format (zeros where invalid)."""
    if dtype == "uint8":
        out[name] = to_chw(pixels)  # invalid rows were never written: already zero
        out["scaling"] = np.full(len(pixels), scaling, dtype=object)
    else:
        out[name] = normalise(pixels, scaling)
        out[name][~valid] = 0.0


def _check_dtype(dtype: str) -> None:
    if dtype not in VIEW_DTYPES:
        raise ValueError(f"dtype must be one of {VIEW_DTYPES}, got {dtype!r}")


def normalise_views(batch: Batch) -> Batch:
    """A batch from a ``dtype="uint8"`` transform → the batch the ``"float32"`` transform gives for the same
    crops: every uint8 pixel column (``view1``, ``view2``, ``image``) becomes normalised float32 ``[N, 3, H, W]``
    by the batch's ``scaling`` column, rows with ``valid == False`` become zeros, and ``scaling`` is dropped.
    A batch without a ``scaling`` column is returned unchanged. Raises ``ValueError`` for mixed scalings."""
    if "scaling" not in batch:
        return batch
    out = dict(batch)
    names = out.pop("scaling")
    if len(names) == 0:  # an empty batch
        return out
    scaling = batch_scaling(names)
    valid = np.asarray(out["valid"], dtype=bool) if "valid" in out else None
    for key in VIEW_COLUMNS:
        value = out.get(key)
        if value is not None and np.asarray(value).dtype == np.uint8:
            out[key] = normalise_chw(np.asarray(value), scaling)
            if valid is not None and not valid.all():
                out[key][~valid] = 0.0
    return out


def check_crop_scale(crop_scale: tuple[float, float]) -> None:
    """``ValueError`` unless ``0 < lo <= hi <= 1`` (RandomResizedCrop's area fractions)."""
    if not 0 < crop_scale[0] <= crop_scale[1] <= 1:
        raise ValueError(f"crop_scale must satisfy 0 < lo <= hi <= 1, got {crop_scale}")


def detail_side(size: int, crop_scale: tuple[float, float]) -> int:
    """The shortest image side (px) that keeps full detail for the smallest crop (area ``crop_scale[0]``) resized to
    ``size``: how far a decoder may shrink an image first (``decode_rgb(min_side=...)``)."""
    return int(math.ceil(size / math.sqrt(crop_scale[0])))


def random_resized_crop_box(width: int, height: int, scale: tuple[float, float], rng: np.random.Generator,
                            ratio: tuple[float, float] = CROP_RATIO) -> tuple[int, int, int, int]:
    """The box (left, top, right, bottom) of torchvision's ``RandomResizedCrop`` parameter draw: area
    fraction uniform in ``scale``, aspect ratio log-uniform in ``ratio``, 10 tries, then a centre crop of
    the nearest allowed ratio. Drawn from ``rng`` (not torch's global generator, which starts from the same
    seed in every Ray worker process and would give every worker the same crops)."""
    area = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(*log_ratio))
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            left = int(rng.integers(0, width - w + 1))
            top = int(rng.integers(0, height - h + 1))
            return left, top, left + w, top + h
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, int(round(width / ratio[0]))
    elif in_ratio > ratio[1]:
        w, h = int(round(height * ratio[1])), height
    else:
        w, h = width, height
    left, top = (width - w) // 2, (height - h) // 2
    return left, top, left + w, top + h


def augmented_view(image: Image.Image, size: int, crop_scale: tuple[float, float], hflip_prob: float,
                   rng: np.random.Generator) -> np.ndarray:
    """One training view: RandomResizedCrop to ``size`` px (bilinear), then a horizontal flip with probability
    ``hflip_prob``; uint8 ``[size, size, 3]``."""
    box = random_resized_crop_box(image.width, image.height, crop_scale, rng)
    view = image.resize((size, size), Image.Resampling.BILINEAR, box=box)
    if rng.random() < hflip_prob:
        view = view.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return np.asarray(view)


def check_photometric(photometric: str, decode_on: str = "host", prefix: str = "") -> None:
    """``ValueError`` unless ``photometric`` is one of :data:`PHOTOMETRIC` and, when it augments, the images are
    decoded on the host (``decode_on``): the device paths crop and flip without it. ``prefix`` names the keys in the
    message (``"data."`` for a config)."""
    if photometric not in PHOTOMETRIC:
        raise ValueError(f"photometric must be one of {PHOTOMETRIC}, got {photometric!r}")
    if photometric != "none" and decode_on != "host":
        raise ValueError(f"{prefix}photometric {photometric!r} runs where the host decodes the images; "
                         f"{prefix}decode_on {decode_on!r} crops and flips on the device without it: "
                         f"use {prefix}decode_on host")


def photometric_view(view: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """UNO's photometric augmentation of an ImageNet-size training view (UNO's ``get_transforms``, the discovery
    views the NCDLR authors' code inherits), on one uint8 crop ``[S, S, 3]`` → a new uint8 ``[S, S, 3]``:

    - with probability 0.5, colour jitter: brightness and contrast factors uniform in [0.7, 1.3], saturation in
      [0.85, 1.15], hue shift uniform in [−0.1, 0.1] of the hue circle, applied in a random order
      (torchvision's ``ColorJitter(0.3, 0.3, 0.15, 0.1)``, whose functional ops do the work);
    - with probability 0.1, greyscale (three equal channels);
    - with probability 0.2, a Gaussian blur of radius σ uniform in [0.1, 2.0] px at 224 px, scaled by ``S / 224``
      (the same blur relative to the crop at other sizes).

    Every draw comes from ``rng`` (not torch's global generator), so a view is a function of its stream."""
    from torchvision.transforms import functional as tvf

    image = Image.fromarray(view)
    if rng.random() < 0.5:
        ops = ((tvf.adjust_brightness, rng.uniform(0.7, 1.3)), (tvf.adjust_contrast, rng.uniform(0.7, 1.3)),
               (tvf.adjust_saturation, rng.uniform(0.85, 1.15)), (tvf.adjust_hue, rng.uniform(-0.1, 0.1)))
        for k in rng.permutation(len(ops)):
            op, factor = ops[k]
            image = op(image, float(factor))
    if rng.random() < 0.1:
        image = tvf.to_grayscale(image, num_output_channels=3)
    if rng.random() < 0.2:
        image = image.filter(ImageFilter.GaussianBlur(radius=float(rng.uniform(0.1, 2.0)) * view.shape[0] / 224))
    return np.asarray(image)


def colour_stream(seq: np.random.SeedSequence) -> np.random.Generator:
    """The photometric draws of one image: a child of its crop stream's seed, so switching the colour augmentation
    on leaves every crop's box and flip as they were (paired comparisons of the same crops)."""
    return np.random.default_rng(np.random.SeedSequence(seq.entropy, spawn_key=(*seq.spawn_key, 2 ** 31)))


@functools.lru_cache(maxsize=None)
def decode_pool(threads: int) -> ThreadPoolExecutor:
    """One pool of ``threads`` decode threads per size per process (a Ray worker reuses it across batches and
    tasks). Work submitted to it must not wait on the same pool (a transform run in it uses ``threads=1``)."""
    return ThreadPoolExecutor(max_workers=threads, thread_name_prefix="ncdlr-decode")


@dataclass(frozen=True)
class TrainViews:
    """Two augmented views per image: ``view1``, ``view2`` float32 ``[N, 3, size, size]`` (``dtype="uint8"``:
    uint8, not normalised, plus a ``scaling`` column; see the module docstring).

    ``seed=None`` draws fresh OS entropy for every batch (the default for training); an int makes the
    views of a given batch reproducible (tests).
    """

    size: int = 224
    crop_scale: tuple[float, float] = (0.5, 1.0)
    hflip_prob: float = 0.5
    scaling: str = "imagenet"
    seed: int | None = None
    dtype: str = "float32"
    threads: int = 1  # images of a batch decoded in parallel threads
    photometric: str = "none"  # "uno": UNO's colour jitter, greyscale and blur after each crop (photometric_view)

    def __post_init__(self) -> None:
        _scale_and_shift(self.scaling)
        _check_dtype(self.dtype)
        check_photometric(self.photometric)
        if self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")
        check_crop_scale(self.crop_scale)

    @property
    def pixel_bytes_per_row(self) -> int:
        """Bytes of one output row's pixel columns (two ``[3, size, size]`` views of ``dtype``)."""
        return 2 * 3 * self.size * self.size * np.dtype(self.dtype).itemsize

    def _view(self, image: Image.Image, rng: np.random.Generator) -> np.ndarray:
        return augmented_view(image, self.size, self.crop_scale, self.hflip_prob, rng)

    def __call__(self, batch: Batch) -> Batch:
        """``batch["image"]``: N encoded images → the batch without ``image``, plus ``view1``, ``view2``,
        ``valid`` (bool ``[N]``) and, for ``dtype="uint8"``, ``scaling``."""
        images = batch["image"]
        n = len(images)
        seqs = np.random.SeedSequence(self.seed).spawn(n)  # one stream per image: same views with or without threads
        rngs = [np.random.default_rng(q) for q in seqs]
        pixels = np.zeros((2, n, self.size, self.size, 3), np.uint8)
        valid = np.zeros(n, dtype=bool)
        min_side = detail_side(self.size, self.crop_scale)

        def one(i: int) -> None:
            image = decode_rgb(images[i], min_side=min_side)
            if image is None:
                return
            valid[i] = True
            pixels[0, i] = self._view(image, rngs[i])
            pixels[1, i] = self._view(image, rngs[i])
            if self.photometric == "uno":
                colour = colour_stream(seqs[i])
                pixels[0, i] = photometric_view(pixels[0, i], colour)
                pixels[1, i] = photometric_view(pixels[1, i], colour)

        if self.threads > 1 and n > 1:  # PIL decodes and resizes without holding the GIL
            list(decode_pool(self.threads).map(one, range(n)))
        else:
            for i in range(n):
                one(i)
        out = {key: value for key, value in batch.items() if key != "image"}
        for name, view in (("view1", pixels[0]), ("view2", pixels[1])):
            _finish(out, name, view, valid, self.scaling, self.dtype)
        out["valid"] = valid
        return out


@dataclass(frozen=True)
class EncodedRows:
    """The read-task transform of ``decode_on="device"``: keeps the encoded ``image`` bytes and the ``columns``
    the consumer needs, decodes nothing (the consumer's :class:`ncdlr.data.device_views.DeviceTrainViews` does)."""

    columns: tuple[str, ...] = ("image", "label", "source_id")
    pixel_bytes_per_row: int = 0  # no pixel columns: each block is stored as it is made

    def __call__(self, batch: Batch) -> Batch:
        return {key: batch[key] for key in self.columns if key in batch}


@dataclass(frozen=True)
class DecodedImages:
    """The read-task transform of ``decode_on="hybrid"``: each encoded image decoded (PIL, ``decode_rgb`` with
    DCT scaling down to no less than ``min_side`` px a side), no crop: a ``pixels`` column of uint8
    ``[h_i, w_i, 3]`` arrays of any size (Ray Data's variable-shaped tensors), ``valid`` (False: undecodable,
    its pixels a 1×1 zero), and ``columns``. The consumer crops (``DeviceTrainViews.of_pixels``)."""

    min_side: int | None = None
    columns: tuple[str, ...] = ("label", "source_id")
    pixel_bytes_per_row: int = 0  # sizes vary: each block is stored as it is made

    def __call__(self, batch: Batch) -> Batch:
        images = batch["image"]
        pixels = np.empty(len(images), dtype=object)
        valid = np.zeros(len(images), dtype=bool)
        for i, data in enumerate(images):
            image = decode_rgb(data, min_side=self.min_side)
            valid[i] = image is not None
            pixels[i] = np.asarray(image) if image is not None else np.zeros((1, 1, 3), np.uint8)
        out = {key: batch[key] for key in self.columns if key in batch}
        out["pixels"], out["valid"] = pixels, valid
        return out


def image_seed(seed: int, source_id: str) -> np.random.SeedSequence:
    """The augmentation stream of one image: a function of ``seed`` and its ``source_id`` only, so the cached
    views of an image are the same however the images are batched, ordered or resumed."""
    digest = hashlib.sha256(str(source_id).encode()).digest()
    return np.random.SeedSequence([int(seed), *np.frombuffer(digest[:16], dtype=np.uint32).tolist()])


@dataclass(frozen=True)
class CachedViews:
    """``views`` training views per image for the activation cache: uint8 ``views`` ``[N, V, 3, S, S]``, ``valid``
    ``[N]`` and ``scaling`` (the model normalises). The same augmentation as :class:`TrainViews`, drawn from
    :func:`image_seed` ``(seed, source_id)`` (the batch must carry ``source_id``)."""

    size: int = 224
    views: int = 8
    crop_scale: tuple[float, float] = (0.5, 1.0)
    hflip_prob: float = 0.5
    scaling: str = "imagenet"
    seed: int = 0
    threads: int = 1
    photometric: str = "none"  # as TrainViews; its draws from colour_stream(image_seed(seed, source_id))

    def __post_init__(self) -> None:
        _scale_and_shift(self.scaling)
        check_photometric(self.photometric)
        if self.views < 1:
            raise ValueError(f"views must be >= 1, got {self.views}")

    @property
    def pixel_bytes_per_row(self) -> int:
        return self.views * 3 * self.size * self.size

    def __call__(self, batch: Batch) -> Batch:
        images, ids = batch["image"], batch["source_id"]
        n = len(images)
        pixels = np.zeros((n, self.views, self.size, self.size, 3), np.uint8)
        valid = np.zeros(n, dtype=bool)
        min_side = detail_side(self.size, self.crop_scale)

        def one(i: int) -> None:
            image = decode_rgb(images[i], min_side=min_side)
            if image is None:
                return
            seq = image_seed(self.seed, ids[i])
            rng = np.random.default_rng(seq)
            colour = colour_stream(seq) if self.photometric == "uno" else None
            valid[i] = True
            for v in range(self.views):
                pixels[i, v] = augmented_view(image, self.size, self.crop_scale, self.hflip_prob, rng)
                if colour is not None:
                    pixels[i, v] = photometric_view(pixels[i, v], colour)

        if self.threads > 1 and n > 1:
            list(decode_pool(self.threads).map(one, range(n)))
        else:
            for i in range(n):
                one(i)
        out = {key: value for key, value in batch.items() if key != "image"}
        out["views"] = np.ascontiguousarray(pixels.transpose(0, 1, 4, 2, 3))
        out["scaling"] = np.full(n, self.scaling, dtype=object)
        out["valid"] = valid
        return out


@dataclass(frozen=True)
class EvalView:
    """One deterministic view per image: short side resized to ``resize`` (default ``size·256/224``), centre
    crop ``size``; ``image`` float32 ``[N, 3, size, size]`` (``dtype="uint8"``: uint8 + ``scaling``, as for
    ``TrainViews``)."""

    size: int = 224
    resize: int | None = None
    scaling: str = "imagenet"
    dtype: str = "float32"

    def __post_init__(self) -> None:
        _scale_and_shift(self.scaling)
        _check_dtype(self.dtype)

    @property
    def pixel_bytes_per_row(self) -> int:
        """Bytes of one output row's pixel column (one ``[3, size, size]`` view of ``dtype``)."""
        return 3 * self.size * self.size * np.dtype(self.dtype).itemsize

    @property
    def resize_to(self) -> int:
        return self.resize if self.resize is not None else int(round(self.size * 256 / 224))

    def _view(self, image: Image.Image) -> np.ndarray:
        short = self.resize_to
        scale = short / min(image.width, image.height)
        width, height = max(short, round(image.width * scale)), max(short, round(image.height * scale))
        left, top = (width - self.size) // 2, (height - self.size) // 2
        resized = image.resize((width, height), Image.Resampling.BILINEAR)
        return np.asarray(resized.crop((left, top, left + self.size, top + self.size)))

    def __call__(self, batch: Batch) -> Batch:
        """``batch["image"]``: N encoded images → the batch with ``image`` replaced by the view, plus ``valid``
        (bool ``[N]``) and, for ``dtype="uint8"``, ``scaling``."""
        images = batch["image"]
        n = len(images)
        pixels = np.zeros((n, self.size, self.size, 3), np.uint8)
        valid = np.zeros(n, dtype=bool)
        for i, data in enumerate(images):
            image = decode_rgb(data, min_side=self.resize_to)
            if image is None:
                continue
            valid[i] = True
            pixels[i] = self._view(image)
        out = {key: value for key, value in batch.items() if key != "image"}
        _finish(out, "image", pixels, valid, self.scaling, self.dtype)
        out["valid"] = valid
        return out


def split_valid(batch: Batch) -> tuple[Batch, list[str]]:
    """Drop the rows with ``valid == False`` from a decoded batch (numpy arrays, torch tensors or lists).

    Returns ``(batch of valid rows, source_ids of the dropped rows)``: the trainer adds
    ``len(bad_ids)`` to the epoch's ``bad_images`` and logs the ids. A batch without a ``valid`` column
    (feature tables) is returned unchanged.
    """
    if "valid" not in batch:
        return batch, []
    valid = np.asarray(batch["valid"].cpu() if hasattr(batch["valid"], "cpu") else batch["valid"], dtype=bool)
    if valid.all():
        return batch, []
    ids = batch.get("source_id")
    bad = [str(ids[i]) for i in np.flatnonzero(~valid)] if ids is not None else [f"row {i}" for i in np.flatnonzero(~valid)]
    keep = np.flatnonzero(valid)
    out: Batch = {}
    for key, value in batch.items():
        if isinstance(value, list):
            out[key] = [value[i] for i in keep]
        elif hasattr(value, "index_select"):  # torch tensor
            import torch

            out[key] = value.index_select(0, torch.as_tensor(keep, device=value.device))
        else:
            out[key] = np.asarray(value)[keep]
    return out, bad
