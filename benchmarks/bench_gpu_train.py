"""The service's training throughput against its own in-memory step ceiling (issue 15): one JSON line per design.

Real Ray Train runs (``ncdlr.service.trainer.fit``: Ray Data streaming a prepared dataset from local shards, one
worker, the shared buffer actor) on a long-tailed dataset of photo-sized JPEGs (448 px: what
``ncdlr prepare --max-side 512`` leaves of a photo; ``photo_dataset``), once per input design (``--decode-on``,
default all three): ``host`` (PIL decode + crops in Ray Data's read tasks, uint8 crops shipped), ``hybrid``
(PIL decode in the read tasks, the decoded images shipped and cropped on the worker's GPU) and ``device``
(encoded bytes shipped, decoded and cropped on the worker's GPU). Each against the same step (``train_step``, same encoder,
sizes, batch and classes) on in-memory device tensors (``bench_gpu.train_step_numbers``: no data loading).
Printed keys:

* ``images_per_s``: the service's mean steps/s over epochs 2.. × 2B × W (B known + B novel images per worker
  and step);
* ``ceiling_images_per_s``: the in-memory step's images/s; ``ratio`` = the two (goal ≥ 0.9 on a GPU);
* ``data_share``: the share of the service's step time spent waiting for the next batch (goal ≤ 0.10);
* ``mfu``: counted FLOPs per step × the service's steps/s ÷ the measured bf16 matmul peak (GPU only, else null);
* ``epoch1_s``, ``later_epoch_s``, ``first_batch_s``, ``first_step_s``: the first epoch's start-up against
  the others (from the run's epoch lines);
* ``epochs_per_execution``: ``data.epochs_per_execution`` of the run (``--epochs-per-execution``: each design
  runs once per value; k > 1 streams k epochs from one Ray Data execution, docs/benchmarks.md "Epoch restarts");
* ``feed_images_per_s`` (with ``--feed``, at the first ``--epochs-per-execution`` value): the design's input
  alone, no training step (``feed_rate``).

Usage::

    python benchmarks/bench_gpu_train.py                # on a GPU node: ViT-B/16, 224 px crops, 128 + 128
    python benchmarks/bench_gpu_train.py --decode-on device
    python benchmarks/bench_gpu_train.py --decode-on hybrid,host --epochs-per-execution 1,4
    python benchmarks/bench_gpu_train.py --smoke        # tiny sizes on CPU (CI runs this): checks the wiring

With ``--smoke`` the numbers mean nothing; the run checks that every key is produced. GPU numbers go into
docs/benchmarks.md with the card named (``device`` in the JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, replace
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

import bench_gpu  # noqa: E402

from ncdlr.service.config import Config  # noqa: E402


@dataclass(frozen=True)
class RunSizes:
    encoder: str
    image: int  # crop side, px
    photo: int  # side of the dataset's square JPEGs, px
    classes: int  # K of the synthetic dataset (half known, half novel)
    n_max: int  # training images of each half's head class
    batch: int  # B per half and worker
    epochs: int
    cpus_per_worker: float
    ceiling_steps: int


FULL = RunSizes("vit_base_patch16_224", 224, 448, 40, 400, 128, 4, 4.0, 20)
SMOKE = RunSizes("tiny_cnn", 32, 48, 6, 24, 8, 2, 1.0, 3)
EPOCH_LINE = re.compile(r"epoch (\d+)/\d+ done in ([\d.]+)s.*?data wait (\d+)%(?:, first batch after ([\d.]+)s, "
                        r"first step ([\d.]+)s)?")


def service_config(sizes: RunSizes, data_uri: str, output: Path, use_gpu: bool, decode_on: str,
                   epochs_per_execution: int = 1) -> Config:
    cfg = Config()
    cfg.data.uri, cfg.data.image_size, cfg.data.batch_size = data_uri, sizes.image, sizes.batch
    cfg.data.decode_on, cfg.data.epochs_per_execution = decode_on, epochs_per_execution
    cfg.model.encoder, cfg.model.trainable_blocks, cfg.model.head = sizes.encoder, 1, "auto"
    cfg.optim.epochs, cfg.optim.warmup_epochs, cfg.optim.amp = sizes.epochs, 1, True
    cfg.labeler.buffer_size = 2048
    cfg.run.output, cfg.run.evaluate = str(output), False
    cfg.run.num_workers, cfg.run.cpus_per_worker = 1, sizes.cpus_per_worker
    cfg.run.use_gpu = "true" if use_gpu else "false"
    return cfg


def _photo(args: tuple[int, int, int]) -> bytes:
    """One ``side``-px square JPEG (quality 90) of a smooth colour field plus noise, seeded by ``(seed, index)``."""
    seed, index, side = args
    import io

    import numpy as np
    from PIL import Image

    rng = np.random.default_rng([seed, index])
    x, y = np.linspace(0, 1, side)[None, :, None], np.linspace(0, 1, side)[:, None, None]
    pixels = 127 + 90 * np.sin(5 * x + 3 * y + rng.uniform(0, 6, (1, 1, 3))) + 12 * rng.standard_normal((side, side, 3))
    out = io.BytesIO()
    Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(out, format="JPEG", quality=90)
    return out.getvalue()


def photo_dataset(uri: str, sizes: RunSizes):
    """A prepared long-tailed dataset of ``sizes.photo``-px JPEGs (class c of each half holds n_max·0.1^(c/(K/2−1))
    training images, imbalance 10), its images made on every core: seconds where the synthetic builder's renderer
    takes minutes at photo sizes. Returns the manifest."""
    from concurrent.futures import ProcessPoolExecutor

    from ncdlr.data.manifest import DatasetInfo
    from ncdlr.data.records import ClassInfo, ImageRecord
    from ncdlr.data.shards import write_dataset

    half = sizes.classes // 2
    counts = [max(2, round(sizes.n_max * 0.1 ** ((c % half) / max(1, half - 1)))) for c in range(sizes.classes)]
    classes = [ClassInfo(label=c, name=f"class_{c:03d}", group="known" if c < half else "novel", train_count=n)
               for c, n in enumerate(counts)]
    rows = [(c, "known" if c < half else "novel") for c, n in enumerate(counts) for _ in range(n)]
    rows += [(c, "test") for c in range(sizes.classes) for _ in range(2)]
    with ProcessPoolExecutor() as pool:
        images = list(pool.map(_photo, [(0, i, sizes.photo) for i in range(len(rows))], chunksize=32))
    records = [ImageRecord(image=image, label=c, split=split, class_name=classes[c].name, source_id=f"photo/{i:06d}.jpg")
               for i, ((c, split), image) in enumerate(zip(rows, images))]
    order = __import__("numpy").random.default_rng(0).permutation(len(records))
    info = DatasetInfo(name="bench-photos", source="benchmarks/bench_gpu_train.py", seed=0,
                       imbalance={"known": 10.0, "novel": 10.0})
    return write_dataset(uri, [records[i] for i in order], classes, info, progress=False)


def epoch_lines(log: Path) -> list[dict]:
    """Per epoch: seconds, data wait share and (epoch 1) the start-up figures, read from the run's train.log."""
    out = []
    for match in EPOCH_LINE.finditer(log.read_text() if log.is_file() else ""):
        epoch, seconds, wait, first_batch, first_step = match.groups()
        out.append({"epoch": int(epoch), "epoch_s": float(seconds), "data_wait": int(wait) / 100,
                    "first_batch_s": float(first_batch) if first_batch else None,
                    "first_step_s": float(first_step) if first_step else None})
    return out


def feed_rate(uri: str, place: str, sizes: RunSizes, device: torch.device, split_rows: dict[str, int]) -> float:
    """Images/s the input design delivers with no training step: ``PairedBatches`` over the known and novel
    streams (the service's pipeline config, read tasks sized for the CPUs Ray Data gets beside the worker),
    views made on ``device``, driven from this process for two epochs; the second is timed."""
    import ray

    from ncdlr.data import pipeline

    cfg = pipeline.PipelineConfig(image_size=sizes.image, batch_size=sizes.batch, decode_on=place)
    free = float(ray.cluster_resources().get("CPU", 1)) - sizes.cpus_per_worker
    cfg = pipeline.read_tasks_for(cfg, split_rows, free)
    datasets = pipeline.build_datasets(uri, cfg, eval_splits=())
    on_device = place != "host"
    batches = pipeline.PairedBatches(datasets["known"], datasets["novel"], batch_size=sizes.batch,
                                     normalise=device.type != "cuda", device=device if on_device else None,
                                     device_views=cfg.device_views() if on_device else None)
    for _ in batches:  # epoch 1: start-up
        pass
    start, images = time.perf_counter(), 0
    for step in batches:
        images += len(step["known"]["source_id"]) + len(step["novel"]["source_id"])
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    batches.close()
    return images / seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on CPU: checks the wiring, no numbers")
    parser.add_argument("--decode-on", default="host,hybrid,device",
                        help="comma list of input designs to run, in order (default host,hybrid,device)")
    parser.add_argument("--feed", action="store_true",
                        help="also time each design's input alone (no training step): feed_images_per_s")
    parser.add_argument("--epochs-per-execution", default="1",
                        help="comma list of data.epochs_per_execution values; every design runs at each, in order "
                             "(default 1: one Ray Data execution per epoch)")
    parser.add_argument("--cpus-per-worker", type=float, default=None,
                        help="CPUs the training worker reserves (default 4; the rest go to Ray Data)")
    args = parser.parse_args(argv)
    try:
        executions = [int(k) for k in args.epochs_per_execution.split(",") if k.strip()]
    except ValueError:
        executions = []
    if not executions or min(executions) < 1:
        parser.error(f"--epochs-per-execution takes positive integers, got {args.epochs_per_execution!r}")
    import ray

    from ncdlr.service.entry import with_worker_setup
    from ncdlr.service.trainer import fit

    use_gpu = torch.cuda.is_available() and not args.smoke
    if not use_gpu and not args.smoke:
        parser.error("no CUDA device: run on a GPU machine, or pass --smoke")
    places = [p.strip() for p in args.decode_on.split(",") if p.strip()]
    if not places or set(places) - {"host", "hybrid", "device"}:
        parser.error(f"--decode-on takes host, hybrid and/or device, got {args.decode_on!r}")
    sizes = SMOKE if args.smoke else FULL
    if args.cpus_per_worker is not None:
        sizes = replace(sizes, cpus_per_worker=args.cpus_per_worker)
    device = torch.device("cuda" if use_gpu else "cpu")
    with tempfile.TemporaryDirectory(prefix="bench-gpu-train-") as tmp:
        root = Path(tmp)
        manifest = photo_dataset(str(root / "data"), sizes)
        # The ceiling first: each design's line is printed as soon as its run ends (a cut-short GPU call keeps them).
        ceiling = bench_gpu.train_step_numbers(
            bench_gpu.Sizes(sizes.encoder, sizes.image, manifest.num_known, manifest.num_novel, sizes.batch,
                            sizes.batch, 2048, 16, 256, 2, sizes.ceiling_steps), device, sizes.batch, 1)
        peak = bench_gpu.matmul_peak(8192, device) if use_gpu else None
        steps_per_epoch = manifest.split_counts["novel"] // sizes.batch
        started = not ray.is_initialized()
        if started:
            ray.init(address="local", num_cpus=max(os.cpu_count() or 1, int(sizes.cpus_per_worker) + 3), include_dashboard=False,
                     log_to_driver=False, logging_level="WARNING", runtime_env=with_worker_setup(None))
        try:
            for execution, place in [(k, p) for k in executions for p in places]:
                run_dir = root / (place if execution == 1 else f"{place}-x{execution}")
                feed = feed_rate(str(root / "data"), place, sizes, device,
                                 {s: manifest.split_counts[s] for s in ("known", "novel")}) \
                    if args.feed and execution == executions[0] else None  # the feed does not depend on it
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # random encoder weights time the same as pretrained ones
                    fit(service_config(sizes, str(root / "data"), run_dir, use_gpu, place, execution))
                epochs = epoch_lines(run_dir / "train.log")
                later = [e for e in epochs if e["epoch"] > 1] or epochs
                seconds = sum(e["epoch_s"] for e in later) / len(later)
                steps_per_s = steps_per_epoch / seconds
                images_per_s = steps_per_s * 2 * sizes.batch
                mfu = ceiling["tflop_per_step"] * steps_per_s / peak if peak else None
                print(json.dumps({
                    "decode_on": place, "epochs_per_execution": execution, "images_per_s": round(images_per_s, 1),
                    "feed_images_per_s": None if feed is None else round(feed, 1),
                    "ceiling_images_per_s": round(ceiling["images_per_s"], 1),
                    "ratio": round(images_per_s / ceiling["images_per_s"], 3),
                    "data_share": round(sum(e["data_wait"] for e in later) / len(later), 3),
                    "mfu": None if mfu is None else round(mfu, 3),
                    "peak_tflops": None if peak is None else round(peak, 1),
                    "epoch1_s": epochs[0]["epoch_s"], "later_epoch_s": round(seconds, 2),
                    "first_batch_s": epochs[0]["first_batch_s"], "first_step_s": epochs[0]["first_step_s"],
                    "device": torch.cuda.get_device_name(device) if use_gpu else (platform.processor() or "cpu"),
                    "cpus": os.cpu_count(), "cpus_per_worker": sizes.cpus_per_worker, "encoder": sizes.encoder,
                    "image": sizes.image, "photo": sizes.photo, "batch_per_half": sizes.batch,
                    "classes": sizes.classes, "steps_per_epoch": steps_per_epoch, "epochs": sizes.epochs,
                    "smoke": args.smoke}), flush=True)
        finally:
            if started:
                ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
