"""Decode and augment encoded images on the training device: the GPU input path (issue 15).

The host path (:class:`ncdlr.data.transforms.TrainViews` in Ray Data's read tasks) decodes with PIL and ships
two uint8 crops per image. This path ships only the encoded bytes; the training worker turns a batch of them
into the same two augmented views on its own device:

1. **decode** (:func:`decode_images`): complete JPEGs with ``torchvision.io.decode_jpeg`` over the whole batch
   at once (nvJPEG on a CUDA device, libjpeg-turbo on the CPU); other formats (PNG, WebP, ...), JPEGs without
   their end marker and JPEGs the batch decoder refuses (CMYK, some progressive files) with PIL on the host
   (``decode_rgb``: transparency flattened onto white, as on the host path), then copied over. An image neither decodes is ``None``: its row comes
   out with ``valid=False`` and zero views; nothing raises for a bad image.
2. **crop boxes** on the host: torchvision's RandomResizedCrop draw and the flip draw, per image from its own
   stream (:func:`ncdlr.data.transforms.random_resized_crop_box`, the same calls in the same order as the
   host path, so the same seed gives the same boxes and flips for images of the same size).
3. **resize** (:func:`resized_crops`): ``torchvision.ops.roi_align`` (``aligned=True``, adaptive sampling)
   crops every box and resamples it to ``size × size`` in one call per group of same-sized images: bilinear
   samples averaged over each output pixel's footprint, i.e. an antialiased downscale, close to PIL's bilinear
   resize with a box (mean difference under 2 grey levels on photo-like test images, tested).
4. **flip and normalise** on the device; output float32 ``[N, 3, S, S]`` ready for the encoder.

Pure torch on whatever device is given, so the whole path runs (and is tested against the host path) on the
CPU; on a GPU only the encoded bytes (≈ 10× fewer than two uint8 crops) cross the host-to-device link.

**Hybrid** (``decode_on="hybrid"``): the host decodes (``ncdlr.data.transforms.DecodedImages`` in the read
tasks, spread over every free CPU) and the device does steps 2–4 (:meth:`DeviceTrainViews.of_pixels`).
The two antialiased resizes cost the host path about twice its JPEG decode (``benchmarks/bench_gpu_step.py
--input-only``: 2.3 ms against 1.2 ms an image), and on an H100 the device path was slower than the host path:
torchvision's nvJPEG path keeps the entropy decoding on the calling CPU thread (docs/benchmarks.md,
"GPU input path").

:func:`on_side_stream` runs either on a CUDA stream of its own, so the next batch's copies and kernels overlap
the training step.
"""

from __future__ import annotations

import threading
import warnings
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

# Imported here, not inside the functions: they run in Ray's prefetch threads while the worker's main thread
# may be importing torchvision too (timm builds the model), and two threads importing one package can see it
# half-initialised (seen: "cannot import name 'StochasticDepth' from partially initialized module").
from torchvision.io import ImageReadMode, decode_jpeg
from torchvision.ops import roi_align

from ncdlr.data.transforms import (_scale_and_shift, _scale_and_shift_on, check_crop_scale, decode_rgb,
                                   random_resized_crop_box)

JPEG_MAGIC = b"\xff\xd8\xff"

# torchvision 0.29 marks its image codecs deprecated in favour of TorchCodec, which neither the GPU image
# (torchvision 0.26) nor our pins carry; the codecs work, so the notice is silenced (only this one message).
warnings.filterwarnings("ignore", message="The image decoding and encoding capabilities of TorchVision",
                        category=DeprecationWarning)


def is_complete_jpeg(data: bytes) -> bool:
    """Whether encoded bytes start like a complete JPEG file: the SOI marker and the next marker's FF at the
    start, the EOI marker (FF D9) in the last 4 KiB. On an H100, nvJPEG decoded a truncated file without an
    error where PIL refuses it (tests/test_gpu.py caught it), so a file without its end goes to PIL."""
    head, tail = bytes(data[:3]), bytes(data[-4096:])
    return head == JPEG_MAGIC and b"\xff\xd9" in tail


def _host_decode(data: bytes, device: torch.device) -> torch.Tensor | None:
    """PIL decode (``decode_rgb``) → uint8 ``[3, h, w]`` on ``device``; None when unreadable."""
    image = decode_rgb(bytes(data))
    if image is None:
        return None
    return torch.from_numpy(np.asarray(image).transpose(2, 0, 1).copy()).to(device, non_blocking=True)


def _jpeg_batch(data: list[bytes], device: torch.device) -> list[torch.Tensor | None]:
    """``decode_jpeg`` over all of ``data`` in one call; when the batch call fails (one bad file fails all),
    each image alone, and PIL for those torchvision refuses."""
    encoded = [torch.frombuffer(bytearray(d), dtype=torch.uint8) for d in data]
    try:
        return list(decode_jpeg(encoded, mode=ImageReadMode.RGB, device=device))
    except RuntimeError:
        out: list[torch.Tensor | None] = []
        for raw, tensor in zip(data, encoded):
            try:
                out.append(decode_jpeg(tensor, mode=ImageReadMode.RGB, device=device))
            except RuntimeError:
                out.append(_host_decode(raw, device))
        return out


def decode_images(data: Sequence[bytes], device: torch.device | str) -> list[torch.Tensor | None]:
    """N encoded images → N uint8 RGB tensors ``[3, h_i, w_i]`` on ``device`` (None where unreadable).

    JPEGs are decoded together by ``torchvision.io.decode_jpeg`` on ``device``; everything else by PIL on the
    host (see the module docstring)."""
    device = torch.device(device)
    out: list[torch.Tensor | None] = [None] * len(data)
    jpegs = [i for i, d in enumerate(data) if d is not None and is_complete_jpeg(d)]
    if jpegs:
        for i, image in zip(jpegs, _jpeg_batch([bytes(data[i]) for i in jpegs], device)):
            out[i] = image
    for i, d in enumerate(data):
        if d is not None and not is_complete_jpeg(d):
            out[i] = _host_decode(d, device)
    return out


def resized_crops(images: Sequence[torch.Tensor], boxes: torch.Tensor, owner: torch.Tensor, size: int,
                  chunk: int = 64, device: torch.device | str | None = None) -> torch.Tensor:
    """Crop ``boxes`` out of ``images`` and resample each to ``size × size``: float32 ``[M, 3, size, size]`` (0–255)
    on ``device`` (default: the images' device).

    ``images``: uint8 ``[3, h_i, w_i]`` (views of host memory are copied over one group at a time);
    ``boxes``: float ``[M, 4]`` (left, top, right, bottom) in pixels of its image (right/bottom exclusive, as
    PIL's ``box``); ``owner``: int64 ``[M]``, the image of each box. One ``roi_align`` per group of at most
    ``chunk`` same-sized images (no padding, so a box at an image edge sees that edge replicated, as PIL does)."""
    device = torch.device(device) if device is not None else images[0].device
    out = torch.empty((len(boxes), 3, size, size), dtype=torch.float32, device=device)
    by_size: dict[tuple[int, int], list[int]] = defaultdict(list)
    for i, image in enumerate(images):
        by_size[tuple(image.shape[1:])].append(i)
    owner_cpu = owner.cpu()
    for members in by_size.values():
        for lo in range(0, len(members), chunk):
            group = members[lo:lo + chunk]
            position = torch.full((len(images),), -1, dtype=torch.int64)
            position[group] = torch.arange(len(group))
            rows = torch.nonzero(position[owner_cpu] >= 0).squeeze(1)
            stacked = torch.stack([images[i] for i in group]).to(device, non_blocking=True).float()
            rois = torch.cat([position[owner_cpu[rows]].to(torch.float32)[:, None], boxes[rows].float()], 1)
            out[rows.to(device)] = roi_align(stacked, rois.to(device), output_size=size, spatial_scale=1.0,
                                              sampling_ratio=-1, aligned=True)
    return out


@dataclass(frozen=True)
class DeviceTrainViews:
    """Two augmented views per encoded image, made on ``device``: the same augmentation as
    :class:`ncdlr.data.transforms.TrainViews` (RandomResizedCrop with area ``crop_scale`` and ratio 3/4–4/3,
    flip with ``hflip_prob``, ``scaling`` normalisation). ``seed=None`` draws fresh entropy per batch."""

    size: int = 224
    crop_scale: tuple[float, float] = (0.5, 1.0)
    hflip_prob: float = 0.5
    scaling: str = "imagenet"
    seed: int | None = None

    def __post_init__(self) -> None:
        _scale_and_shift(self.scaling)
        check_crop_scale(self.crop_scale)

    def boxes(self, sizes: Sequence[tuple[int, int] | None]) -> tuple[np.ndarray, np.ndarray]:
        """Crop boxes ``[N, 2, 4]`` (float, pixels) and flips ``[N, 2]`` (bool) for images of ``sizes`` (h, w)
        (None: undecodable, all zeros), drawn per image as the host path draws them."""
        n = len(sizes)
        rngs = np.random.default_rng(self.seed).spawn(n)
        boxes = np.zeros((n, 2, 4), dtype=np.float64)
        flips = np.zeros((n, 2), dtype=bool)
        for i, hw in enumerate(sizes):
            if hw is None:
                continue
            for v in range(2):
                boxes[i, v] = random_resized_crop_box(hw[1], hw[0], self.crop_scale, rngs[i])
                flips[i, v] = rngs[i].random() < self.hflip_prob
        return boxes, flips

    def raw_views(self, data: Sequence[bytes], device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
        """Encoded images → (uint8-range float32 views ``[2, N, 3, S, S]`` before normalisation, valid ``[N]``
        bool on ``device``); invalid rows are zeros."""
        return self._views(decode_images(data, device), torch.device(device))

    def raw_views_of_pixels(self, pixels: Sequence[torch.Tensor], valid: torch.Tensor, device: torch.device | str
                            ) -> tuple[torch.Tensor, torch.Tensor]:
        """Decoded images (uint8 ``[h_i, w_i, 3]`` on the host, ``valid`` ``[N]`` bool: the ``pixels`` column of
        ``DecodedImages``) → :meth:`raw_views`' output; same-sized images cross to ``device`` together."""
        images = [p.permute(2, 0, 1) if ok else None for p, ok in zip(pixels, valid.tolist())]
        return self._views(images, torch.device(device))

    def _views(self, images: Sequence[torch.Tensor | None], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        n = len(images)
        valid = torch.tensor([image is not None for image in images], dtype=torch.bool)
        boxes, flips = self.boxes([tuple(image.shape[1:]) if image is not None else None for image in images])
        views = torch.zeros((2, n, 3, self.size, self.size), dtype=torch.float32, device=device)
        good = torch.nonzero(valid).squeeze(1)
        if len(good):
            decoded = [images[i] for i in good.tolist()]
            owner = torch.arange(len(decoded)).repeat_interleave(2)  # [2G]: image g's view 0, then view 1
            crops = resized_crops(decoded, torch.from_numpy(boxes[good.numpy()].reshape(-1, 4)), owner, self.size,
                                  device=device)
            flip = torch.from_numpy(flips[good.numpy()].reshape(-1)).to(device)
            crops = torch.where(flip[:, None, None, None], crops.flip(3), crops)
            views[:, good.to(device)] = crops.view(len(decoded), 2, 3, self.size, self.size).transpose(0, 1)
        return views, valid.to(device)

    def __call__(self, data: Sequence[bytes], device: torch.device | str) -> dict[str, Any]:
        """Encoded images → ``view1``, ``view2`` normalised float32 ``[N, 3, S, S]`` and ``valid`` bool ``[N]``, all
        on ``device`` (rows of undecodable images: zeros, as on the host path)."""
        return self._normalised(*self.raw_views(data, device))

    def of_pixels(self, pixels: Sequence[torch.Tensor], valid: torch.Tensor, device: torch.device | str
                  ) -> dict[str, Any]:
        """:meth:`__call__` for images the host decoded (:meth:`raw_views_of_pixels`)."""
        return self._normalised(*self.raw_views_of_pixels(pixels, valid, device))

    def _normalised(self, views: torch.Tensor, valid: torch.Tensor) -> dict[str, Any]:
        scale, shift = _scale_and_shift_on(self.scaling, views.device)
        views.mul_(scale).add_(shift)
        views.masked_fill_(~valid[None, :, None, None, None], 0.0)
        return {"view1": views[0], "view2": views[1], "valid": valid}


_SIDE_STREAMS = threading.local()


def on_side_stream(device: torch.device, make: Any) -> dict[str, Any]:
    """``make()`` (which returns a dict of tensors made on ``device``), run on a CUDA stream of this thread's own
    and waited for, so the copies and kernels of the next batch overlap the training step on the default
    stream; the results are marked as used by the default stream (``record_stream``) so their memory is not
    reused before the step that reads them is done. On a CPU device: ``make()``."""
    if device.type != "cuda":
        return make()
    streams = _SIDE_STREAMS.__dict__.setdefault("by_device", {})
    stream = streams.setdefault(device, torch.cuda.Stream(device))
    with torch.cuda.stream(stream):
        out = make()
    stream.synchronize()  # this (prefetch) thread waits; the step's stream does not
    consumer = torch.cuda.default_stream(device)
    for value in out.values():
        if isinstance(value, torch.Tensor) and value.is_cuda:
            value.record_stream(consumer)
    return out
