"""The activation cache's model actor (``ncdlr embed --trainable-blocks 1``): fixed small passes against the plain
64-row passes it ran before, on the same batches, interleaved.

Both sides run the frozen stem of ``efficientnet_lite0`` (or ``--encoder``) on what Ray Data hands an actor: a training
batch of ``--batch`` rows × ``--views`` uint8 crops, and an eval batch of ``--batch`` float32 centre views. The
baseline is the previous code path (the batch's images in plain passes of 64, the last one short); the candidate is
the actor as shipped (``_StemActor``: passes of exactly ``pass_rows`` images, the last one padded; ``--pass-rows``
0 = the default for the image size). Reading, decoding and cropping are the same on both sides and not timed.
Medians over ``--reps`` interleaved repetitions, after one warm-up of each. One JSON line: images per second for each
batch kind and side, and ``ratio`` = candidate / baseline (> 1: the candidate is faster).

Usage:  .venv/bin/python benchmarks/bench_embed.py [--size 160] [--views 8] [--batch 32] [--threads 1] [--reps 3]
            [--pass-rows 0] [--encoder efficientnet_lite0]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ncdlr.data.transforms import batch_scaling, normalise_chw_torch  # noqa: E402
from ncdlr.models import input_scaling  # noqa: E402
from ncdlr.service.embed import _StemActor  # noqa: E402

BASELINE_ROWS = 64  #: the actor's plain pass size before fixed passes


def baseline(actor: _StemActor, batch: dict) -> np.ndarray:
    """The previous actor body: the batch's images in plain passes of 64 (float16 ``[n, V, *shape]``)."""
    if "views" in batch:
        views = torch.as_tensor(batch["views"])
        n, v = views.shape[:2]
        images, scaling = views.reshape(n * v, *views.shape[2:]), batch_scaling(batch["scaling"])
    else:
        images, scaling = torch.as_tensor(batch["image"]), None
        n, v = images.shape[0], 1
    outs = []
    with torch.inference_mode():
        for part in images.split(BASELINE_ROWS):
            x = normalise_chw_torch(part, scaling) if scaling is not None else part
            outs.append(actor.encoder.stem(x, actor.blocks).to(torch.float16))
    out = torch.cat(outs)
    return out.reshape(n, v, *out.shape[1:]).numpy()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--encoder", default="efficientnet_lite0", help="an encoder the activation cache supports")
    parser.add_argument("--size", type=int, default=160, help="crop side in pixels")
    parser.add_argument("--views", type=int, default=8, help="training crops per row")
    parser.add_argument("--batch", type=int, default=32, help="rows per Ray Data batch (embed --batch-size)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the actor (embed --threads)")
    parser.add_argument("--pass-rows", type=int, default=0,
                        help="the candidate's pass size (0: the default for --size)")
    parser.add_argument("--reps", type=int, default=3, help="timed repetitions of each side (after one warm-up)")
    args = parser.parse_args(argv)
    from ncdlr.models.batching import pass_rows

    rows = args.pass_rows or pass_rows(args.size)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # timm without weights warns (by design)
        actor = _StemActor(args.encoder, "", args.size, 1, args.threads, rows)
    rng = np.random.default_rng(0)
    n, s = args.batch, args.size
    common = {"valid": np.ones(n, bool), "label": np.zeros(n, np.int64), "split": np.array(["novel"] * n),
              "source_id": np.array([f"{i}" for i in range(n)])}
    batches = {
        "train": {**common, "views": rng.integers(0, 256, (n, args.views, 3, s, s), dtype=np.uint8),
                  "scaling": np.array([input_scaling(args.encoder)] * n)},
        "eval": {**common, "image": rng.standard_normal((n, 3, s, s)).astype(np.float32)},
    }
    images = {"train": n * args.views, "eval": n}
    times: dict[tuple[str, str], list[float]] = {(k, side): [] for k in batches for side in ("baseline", "fixed")}
    for rep in range(args.reps + 1):
        for kind, batch in batches.items():
            for side in ("baseline", "fixed"):
                start = time.perf_counter()
                out = baseline(actor, batch) if side == "baseline" else actor(batch)["activation"]
                if rep:  # the first repetition warms up
                    times[(kind, side)].append(time.perf_counter() - start)
            assert out.shape[:2] == (n, args.views if kind == "train" else 1)
    rate = {key: images[key[0]] / statistics.median(v) for key, v in times.items()}
    report = {"encoder": args.encoder, "size": s, "views": args.views, "batch": n, "threads": args.threads,
              "baseline_rows": BASELINE_ROWS, "pass_rows": rows, "reps": args.reps}
    for kind in batches:
        report[f"{kind}_baseline_images_per_s"] = round(rate[(kind, "baseline")], 1)
        report[f"{kind}_fixed_images_per_s"] = round(rate[(kind, "fixed")], 1)
        report[f"{kind}_ratio"] = round(rate[(kind, "fixed")] / rate[(kind, "baseline")], 2)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
