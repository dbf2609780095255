"""One training step on cached activations vs the image-mode step it replaces (same model, same batch size).

Both steps are the service's ``train_step`` (ncdlr, buffer, labeler) on ``efficientnet_lite0`` with its last
block trained, B known + B novel rows and two views each: image mode on ``[4B, 3, S, S]`` crops (the frozen
stem runs every step; decoding and cropping are NOT counted, which favours image mode), cache mode on the stem's
``[4B, 192, s, s]`` activations (``model.cached_blocks = 1``). The baseline (image mode) is measured in the same
run, interleaved, so the ratio holds on a noisy machine. With ``--mixup A`` a third mode, the cache step with
``optim.mixup = A`` (2B more rows through the trained block), is interleaved too and priced against the plain cache
step (``mixup_cost``). With ``--average-epochs H`` another mode, the cache step that also updates a moving average
of the weights (``optim.average_epochs = H``), priced the same way (``average_cost``); with ``--teacher-epochs H``
the cache step whose novel rows a mean teacher labels (``optim.teacher_epochs = H``: one more forward of the 2B
novel rows, no gradient, and a second moving average), priced the same way (``teacher_cost``). One JSON line.

Usage:  .venv/bin/python benchmarks/bench_cache.py [--batch 32] [--size 160] [--steps 6] [--threads 1] [--mixup 1]
            [--average-epochs 2] [--teacher-epochs 0.5]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ncdlr.buffer import LocalBuffer  # noqa: E402
from ncdlr.methods import build_method  # noqa: E402
from ncdlr.models import build_model  # noqa: E402
from ncdlr.service.config import Config  # noqa: E402
from ncdlr.service.train_loop import PairedBatch, build_worker_state, train_step  # noqa: E402


#: the modes priced against the plain cache step: mode → the ``optim`` key it switches on (and the flag that sets it)
EXTRA_MODES = {"mixup": "mixup", "average": "average_epochs", "teacher": "teacher_epochs"}


def state_for(cfg: Config, model, optim=None):
    method = build_method(cfg.method, cfg.labeler, model.num_novel)
    method.connect(buffer=LocalBuffer(cfg.labeler.buffer_size, model.num_novel, "cpu"))
    return build_worker_state(optim or cfg.optim, model, method, 100, torch.device("cpu"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=32, help="B: known and novel rows per step")
    parser.add_argument("--size", type=int, default=160, help="crop side in pixels")
    parser.add_argument("--steps", type=int, default=6, help="timed steps per mode (after one warm-up step)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--mixup", type=float, default=0.0,
                        help="also time the cache step with optim.mixup = this Beta parameter (0: not timed)")
    parser.add_argument("--average-epochs", type=float, default=0.0,
                        help="also time the cache step with optim.average_epochs = this horizon (0: not timed)")
    parser.add_argument("--teacher-epochs", type=float, default=0.0,
                        help="also time the cache step with optim.teacher_epochs = this horizon (0: not timed)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    cfg = Config()
    cfg.model.encoder, cfg.model.trainable_blocks, cfg.model.head = "efficientnet_lite0", 1, "linear"
    cfg.labeler.gamma, cfg.labeler.buffer_size = 10.0, 256
    torch.manual_seed(0)
    image_model = build_model(cfg.model, 22, 21, image_size=args.size)
    cfg.model.cached_blocks = 1
    cached_model = build_model(cfg.model, 22, 21, image_size=args.size)
    cached_model.load_state_dict(image_model.state_dict())
    b = args.batch
    crops = [torch.randn(b, 3, args.size, args.size) for _ in range(4)]
    with torch.no_grad():
        acts = [image_model.encoder.eval().stem(c, 1) for c in crops]
    labels, valid = torch.randint(0, 22, (b,)), torch.ones(b, dtype=torch.bool)
    states = {"image": (state_for(cfg, image_model), crops), "cache": (state_for(cfg, cached_model), acts)}
    optim_of = {}
    for mode, key in EXTRA_MODES.items():  # each priced mode: the cache step with one optim setting switched on
        value = getattr(args, key)
        if value > 0:
            optim_of[mode] = copy.deepcopy(cfg.optim)
            setattr(optim_of[mode], key, value)
            model = build_model(cfg.model, 22, 21, image_size=args.size)
            model.load_state_dict(image_model.state_dict())
            states[mode] = (state_for(cfg, model, optim_of[mode]), acts)
    times: dict[str, list[float]] = {mode: [] for mode in states}
    for step in range(args.steps + 1):
        for mode, (state, views) in states.items():
            batch = PairedBatch(views[0], views[1], labels, valid, views[2], views[3], valid)
            start = time.perf_counter()
            train_step(state, batch, optim_of.get(mode, cfg.optim))
            if step:  # the first step of each mode warms up
                times[mode].append(time.perf_counter() - start)
    image_s, cache_s = statistics.median(times["image"]), statistics.median(times["cache"])
    extra = {}
    for mode in optim_of:
        mode_s = statistics.median(times[mode])
        extra.update({EXTRA_MODES[mode]: getattr(args, EXTRA_MODES[mode]), f"{mode}_step_s": round(mode_s, 4),
                      f"{mode}_cost": round(mode_s / cache_s, 2)})
    print(json.dumps({"batch": b, "size": args.size, "threads": args.threads, "activation_shape": list(acts[0].shape[1:]),
                      "image_step_s": round(image_s, 4), "cache_step_s": round(cache_s, 4),
                      "speedup": round(image_s / cache_s, 2),
                      "image_views_per_s": round(4 * b / image_s, 1), "cache_views_per_s": round(4 * b / cache_s, 1), **extra}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
