"""The service's training throughput against its own in-memory step ceiling (issue 15): one JSON line.

A real Ray Train run (``ncdlr.service.trainer.fit``: Ray Data streaming a prepared dataset from local shards,
decode + augment in read tasks, one worker, the shared buffer actor) on a synthetic iNat-format dataset, against
the same step (``train_step``, same encoder, sizes, batch and classes) on in-memory device tensors
(``bench_gpu.train_step_numbers``: no data loading at all). Printed keys:

* ``images_per_s``: the service's last-epoch steps/s × 2B × W (B known + B novel images per worker and step);
* ``ceiling_images_per_s``: the in-memory step's images/s; ``ratio`` = the two (goal ≥ 0.9 on a GPU);
* ``data_share``: the share of the service's step time spent waiting for the next batch (goal ≤ 0.10);
* ``mfu``: counted FLOPs per step × the service's steps/s ÷ the measured bf16 matmul peak (GPU only, else null).

Usage::

    python benchmarks/bench_gpu_train.py                # on a GPU node: ViT-B/16, 224 px, 128 + 128, 40 classes
    python benchmarks/bench_gpu_train.py --smoke        # tiny sizes on CPU (CI runs this): checks the wiring

With ``--smoke`` the numbers mean nothing; the run checks that every key is produced. GPU numbers go into
docs/benchmarks.md with the card named (``device`` in the JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

import bench_gpu  # noqa: E402

from ncdlr.service.config import Config  # noqa: E402


@dataclass(frozen=True)
class RunSizes:
    encoder: str
    image: int  # crop side, px (the dataset's images are this size too)
    classes: int  # K of the synthetic dataset (half known, half novel)
    n_max: int  # training images of each half's head class
    batch: int  # B per half and worker
    epochs: int
    cpus_per_worker: float
    ceiling_steps: int


FULL = RunSizes("vit_base_patch16_224", 224, 40, 600, 128, 4, 4.0, 20)
SMOKE = RunSizes("tiny_cnn", 32, 6, 24, 8, 2, 1.0, 3)


def service_config(sizes: RunSizes, data_uri: str, output: Path, use_gpu: bool) -> Config:
    cfg = Config()
    cfg.data.uri, cfg.data.image_size, cfg.data.batch_size = data_uri, sizes.image, sizes.batch
    cfg.model.encoder, cfg.model.trainable_blocks, cfg.model.head = sizes.encoder, 1, "auto"
    cfg.optim.epochs, cfg.optim.warmup_epochs, cfg.optim.amp = sizes.epochs, 1, True
    cfg.labeler.buffer_size = 2048
    cfg.run.output, cfg.run.evaluate = str(output), False
    cfg.run.num_workers, cfg.run.cpus_per_worker = 1, sizes.cpus_per_worker
    cfg.run.use_gpu = "true" if use_gpu else "false"
    return cfg


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on CPU: checks the wiring, no numbers")
    args = parser.parse_args(argv)
    import ray

    from ncdlr.data.builders import synthetic
    from ncdlr.service.trainer import fit

    use_gpu = torch.cuda.is_available() and not args.smoke
    if not use_gpu and not args.smoke:
        parser.error("no CUDA device: run on a GPU machine, or pass --smoke")
    sizes = SMOKE if args.smoke else FULL
    device = torch.device("cuda" if use_gpu else "cpu")
    with tempfile.TemporaryDirectory(prefix="bench-gpu-train-") as tmp:
        root = Path(tmp)
        manifest = synthetic.build(synthetic.SyntheticConfig(num_classes=sizes.classes, n_max=sizes.n_max,
                                                             image_size=sizes.image, test_per_class=2),
                                   str(root / "data"), progress=False)
        started = not ray.is_initialized()
        if started:
            ray.init(num_cpus=max(os.cpu_count() or 1, int(sizes.cpus_per_worker) + 3), include_dashboard=False,
                     log_to_driver=False, logging_level="WARNING")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # random encoder weights time the same as pretrained ones
                result = fit(service_config(sizes, str(root / "data"), root / "run", use_gpu))
        finally:
            if started:
                ray.shutdown()
    metrics = result["metrics"]
    images_per_s = float(metrics["steps_per_s"]) * 2 * sizes.batch
    ceiling = bench_gpu.train_step_numbers(
        bench_gpu.Sizes(sizes.encoder, sizes.image, manifest.num_known, manifest.num_novel, sizes.batch, sizes.batch,
                        2048, 16, 256, 2, sizes.ceiling_steps), device, sizes.batch, 1)
    peak = bench_gpu.matmul_peak(8192, device) if use_gpu else None
    mfu = ceiling["tflop_per_step"] * float(metrics["steps_per_s"]) / peak if peak else None
    print(json.dumps({
        "images_per_s": round(images_per_s, 1), "ceiling_images_per_s": round(ceiling["images_per_s"], 1),
        "ratio": round(images_per_s / ceiling["images_per_s"], 3), "data_share": round(float(metrics["data_share"]), 3),
        "mfu": None if mfu is None else round(mfu, 3), "peak_tflops": None if peak is None else round(peak, 1),
        "device": torch.cuda.get_device_name(device) if use_gpu else (platform.processor() or "cpu"),
        "encoder": sizes.encoder, "image": sizes.image, "batch_per_half": sizes.batch, "classes": sizes.classes,
        "epochs": sizes.epochs, "smoke": args.smoke}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
