"""What the photometric views cost on the host: ``TrainViews`` with ``photometric="uno"`` against ``"none"``.

``data.photometric uno`` (image mode) and ``ncdlr embed --photometric uno`` (the activation cache) add UNO's colour
jitter, greyscale and blur (``ncdlr.data.transforms.photometric_view``) after each crop and flip. This times the
decode + two views of ``--images`` real JPEGs (``--source-size`` px, random content) at ``--image-size`` px, uint8 out
(what the pipeline ships), one thread, both settings in turn in the same run, the best of ``--repeats`` for each, and
prints images/s for both and the ratio uno / none (the throughput kept) — a baseline measured beside it, since the
machines are noisy.

Usage:  .venv/bin/python benchmarks/bench_views.py [--images 256] [--image-size 224] [--repeats 5]
"""

from __future__ import annotations

import argparse
import io
import json
import time

import numpy as np
from PIL import Image

from ncdlr.data.transforms import TrainViews


def jpegs(n: int, side: int, seed: int = 0) -> np.ndarray:
    """``n`` real JPEGs of ``side`` px: smooth random colour fields (so colour ops have colour to change)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        small = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
        image = Image.fromarray(small).resize((side, side), Image.Resampling.BILINEAR)
        buf = io.BytesIO()
        image.save(buf, format="JPEG", quality=85)
        out.append(buf.getvalue())
    return np.array(out, dtype=object)


def images_per_s(transform: TrainViews, batch: dict, repeats: int) -> float:
    """Best of ``repeats`` whole-batch calls, in images per second."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        transform(batch)
        best = min(best, time.perf_counter() - start)
    return len(batch["image"]) / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=256, help="JPEGs decoded per call")
    parser.add_argument("--source-size", type=int, default=320, help="side of each JPEG, px")
    parser.add_argument("--image-size", type=int, default=224, help="side of each view, px")
    parser.add_argument("--repeats", type=int, default=5, help="calls per setting; the best is kept")
    args = parser.parse_args()
    batch = {"image": jpegs(args.images, args.source_size)}
    rates = {}
    for setting in ("none", "uno", "none", "uno"):  # interleaved: a drift in the machine's speed hits both
        views = TrainViews(size=args.image_size, seed=0, dtype="uint8", photometric=setting)
        rates[setting] = max(rates.get(setting, 0.0), images_per_s(views, batch, args.repeats))
    print(json.dumps({"images": args.images, "image_size": args.image_size, "none_images_per_s": round(rates["none"], 1),
                      "uno_images_per_s": round(rates["uno"], 1), "ratio_uno_over_none": round(rates["uno"] / rates["none"], 3)}))


if __name__ == "__main__":
    main()
