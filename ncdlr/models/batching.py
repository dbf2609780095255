"""Frozen-encoder passes whose per-image output does not depend on the batch an image arrived in.

CPU convolution kernels are chosen by the input's shape: measured here (oneDNN, efficientnet_lite0 stem at 160 px,
one thread), a pass over fewer than 16 images takes another algorithm than a pass over 16 or more, and about 1 % of
the float16 activations then differ by one unit in the last place. Ray Data hands an actor whatever rows a block
boundary leaves, so a cache rebuilt with the same command differed from the first build in a few rows, and a
training run on it drifted from the first run. Running every pass on exactly ``rows`` rows (the last one padded
with zeros) fixes the kernel, so an image's output depends only on the image, the weights and the thread count.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

PIXELS_PER_PASS = 2 ** 17  #: input pixels per frozen pass (:func:`pass_rows`): about 5 images at 160 px, 2 at 224


def pass_rows(image_size: int, pixels: int = PIXELS_PER_PASS) -> int:
    """Images per frozen pass at ``image_size`` px: ``pixels // image_size²``, within ``[1, 64]``.

    Small passes keep a convolutional stem's early activations in the CPU caches: efficientnet_lite0's stem at 160 px
    ran its training crops 2.3× faster in passes of 5 than in plain passes of 64 on a 2-core machine, at one and at
    two threads (``benchmarks/bench_embed.py``; docs/benchmarks.md, "Session 40: frozen passes of one fixed size");
    a ViT's rate hardly depends on the pass size."""
    if image_size < 1:
        raise ValueError(f"image_size must be >= 1, got {image_size}")
    return max(1, min(64, pixels // (image_size * image_size)))


def fixed_passes(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, rows: int) -> torch.Tensor:
    """``fn`` over ``x [n, ...]`` in passes of exactly ``rows`` rows → ``[n, ...out]`` (``n = 0`` → ``[0]`` rows of
    one zero pass's output shape).

    The last pass is padded with zero rows, whose outputs are dropped, so every pass has the same shape and a row's
    output is the same whichever rows share its batch (``fn`` must treat rows independently, as an encoder in eval
    mode does)."""
    if rows < 1:
        raise ValueError(f"rows must be >= 1, got {rows}")
    n = x.shape[0]
    outs = []
    for start in range(0, max(n, 1), rows):
        part = x[start:start + rows]
        if part.shape[0] < rows:
            part = torch.cat([part, part.new_zeros((rows - part.shape[0], *x.shape[1:]))])
        outs.append(fn(part))
    return torch.cat(outs)[:n]
