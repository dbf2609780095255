"""Epoch restarts: the training streams' images/s with one Ray Data execution per epoch vs several epochs per
execution (``PipelineConfig.passes_per_execution``), in one run.

Each Ray Data execution starts slowly (planning, launching read tasks, and Ray Data 2.60 runs about one task
at a time until its first resource-limit poll answers), so short epochs lose a share of every epoch to it.
This benchmark iterates ``PairedBatches`` (known + novel streams, ``steps_per_epoch`` steps an epoch, exactly
as a Ray Train worker does) for ``--epochs`` epochs with each setting, alternating settings round by round,
and reports the images/s over epochs 2.. (epoch 1 holds the pipeline's first start for both).

Two decode modes:

* ``--decode sleep`` (default): every image costs ``--ms-per-image`` of *sleep* in the read task (the GIL
  released, as PIL's decode releases it) instead of CPU work, and yields uint8 views of the real size. That
  emulates a node with ``--cpus`` cores on a machine with fewer: the read tasks' concurrency, not this
  machine's cores, sets the rate. This is the situation of a 16-core GPU node, which we cannot hold long enough
  to tune on.
* ``--decode jpeg``: the real ``TrainViews`` on real 448 px JPEGs, on this machine's cores (``--cpus`` should
  then be the real core count).

Usage::

    .venv/bin/python benchmarks/bench_epochs.py                          # sleep decode, 12 logical CPUs
    .venv/bin/python benchmarks/bench_epochs.py --decode jpeg --cpus 2 --rows 600
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]


@dataclass(frozen=True)
class SleepViews:
    """Stand-in for ``TrainViews(dtype="uint8")``: ``ms_per_image`` of sleep per image, zero views of the real size."""

    size: int
    ms_per_image: float

    @property
    def pixel_bytes_per_row(self) -> int:
        return 2 * 3 * self.size * self.size

    def __call__(self, batch: dict) -> dict:
        n = len(batch["image"])
        time.sleep(self.ms_per_image * n / 1e3)
        views = np.zeros((n, 3, self.size, self.size), np.uint8)
        return {"view1": views, "view2": views.copy(), "label": batch["label"], "source_id": batch["source_id"],
                "valid": np.ones(n, bool), "scaling": np.full(n, "imagenet", dtype=object)}


def dataset(root: str, rows: int, decode: str) -> dict[str, int]:
    """A prepared 4-class dataset (2 known, 2 novel) with ``rows`` training rows per split; returns split counts."""
    from ncdlr.data.manifest import DatasetInfo
    from ncdlr.data.records import ClassInfo, ImageRecord
    from ncdlr.data.shards import write_dataset

    if decode == "jpeg":
        from concurrent.futures import ProcessPoolExecutor

        import bench_gpu_train

        with ProcessPoolExecutor() as pool:
            images = list(pool.map(bench_gpu_train._photo, [(1, i, 448) for i in range(2 * rows)], chunksize=16))
    else:
        images = [b"\xff\xd8\xff" + bytes(1000)] * (2 * rows)  # never decoded: SleepViews ignores it
    per_class = rows // 2
    classes = [ClassInfo(label=c, name=f"c{c}", group="known" if c < 2 else "novel", train_count=per_class)
               for c in range(4)]
    records = [ImageRecord(image=images[(c * per_class + i) % len(images)], label=c,
                           split="known" if c < 2 else "novel", class_name=f"c{c}", source_id=f"c{c}/{i}")
               for c in range(4) for i in range(per_class)]
    records += [ImageRecord(image=images[c], label=c, split="test", class_name=f"c{c}", source_id=f"t{c}")
                for c in range(4)]
    manifest = write_dataset(root, records, classes, DatasetInfo("bench-epochs", "benchmarks/bench_epochs.py", 0),
                             progress=False)
    return {s: manifest.split_counts[s] for s in ("known", "novel")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--decode", choices=["sleep", "jpeg"], default="sleep")
    parser.add_argument("--cpus", type=int, default=12, help="logical CPUs of the local Ray (default 12)")
    parser.add_argument("--rows", type=int, default=1600, help="training rows per split (default 1600)")
    parser.add_argument("--batch", type=int, default=128, help="B per stream and step (default 128)")
    parser.add_argument("--epochs", type=int, default=5, help="epochs per setting and round (default 5)")
    parser.add_argument("--passes", type=int, default=4, help="epochs per execution to compare with 1 (default 4)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds, settings alternating (default 2)")
    parser.add_argument("--ms-per-image", type=float, default=4.0, help="sleep decode: ms per image (default 4)")
    parser.add_argument("--size", type=int, default=224, help="view side, px (default 224)")
    parser.add_argument("--object-store-mb", type=int, default=0,
                        help="PipelineConfig.object_store_limit_bytes in MiB per dataset for both settings; 0 (the "
                             "default) = none, what passes_per_execution > 1 uses (see limit_memory)")
    args = parser.parse_args(argv)
    import ray

    from ncdlr.data import pipeline
    from ncdlr.service.entry import with_worker_setup

    root = tempfile.mkdtemp(prefix="bench-epochs-")
    split_rows = dataset(root + "/data", args.rows, args.decode)
    steps = split_rows["novel"] // args.batch
    ray.init(address="local", num_cpus=args.cpus, include_dashboard=False, log_to_driver=False, logging_level="ERROR",
             # read tasks unpickle SleepViews, so they need benchmarks/ on their path
             runtime_env=with_worker_setup({"env_vars": {"PYTHONPATH": f"{HERE}:{HERE.parent}"}}))
    rates: dict[int, list[float]] = {1: [], args.passes: []}
    for round_ in range(args.rounds):
        for passes in (1, args.passes) if round_ % 2 == 0 else (args.passes, 1):
            cfg = pipeline.PipelineConfig(image_size=args.size, batch_size=args.batch, passes_per_execution=passes,
                                          object_store_limit_bytes=args.object_store_mb * 2**20 or None)
            cfg = pipeline.read_tasks_for(cfg, split_rows, float(args.cpus))
            raw = pipeline.load_splits(root + "/data", ["known", "novel"], verify="none")
            if args.decode == "sleep":
                streams = {k: pipeline._decode(v, lambda threads: SleepViews(args.size, args.ms_per_image), cfg, passes)
                           for k, v in raw.items()}
            else:
                streams = {k: pipeline.with_train_views(v, cfg) for k, v in raw.items()}
            batches = pipeline.PairedBatches(streams["known"], streams["novel"], batch_size=args.batch,
                                             normalise=False, steps_per_epoch=steps)
            for _ in batches:  # epoch 1: the first start, both settings alike
                pass
            start, images = time.perf_counter(), 0
            for _ in range(args.epochs - 1):
                for step in batches:
                    images += len(step["known"]["source_id"]) + len(step["novel"]["source_id"])
            rates[passes].append(images / (time.perf_counter() - start))
            batches.close()
            print(f"[bench_epochs] round {round_ + 1}, {passes} epoch(s) per execution: {rates[passes][-1]:.0f} images/s",
                  flush=True)
    ray.shutdown()
    one, many = statistics.median(rates[1]), statistics.median(rates[args.passes])
    print(json.dumps({"decode": args.decode, "cpus": args.cpus, "rows_per_split": args.rows, "steps_per_epoch": steps,
                      "epochs_timed": args.epochs - 1, "one_per_execution_images_per_s": round(one, 1),
                      f"{args.passes}_per_execution_images_per_s": round(many, 1), "ratio": round(many / one, 2),
                      "rounds": args.rounds}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
