"""Decoded + augmented images/s: Ray Data from the rclone S3 server vs. the same shards on local disk vs. a
plain torch DataLoader over the JPEG files, at the same CPU count, in one run.

Every path does the same work per image and delivers the same thing: decode the JPEG (PIL, with
``Image.draft`` DCT scaling), draw two RandomResizedCrop (scale 0.5-1) + horizontal-flip views of S px,
normalise them to float32 ``[3, S, S]`` (ImageNet mean/std), and hand the training loop torch batches of
B rows (``view1``, ``view2`` float32 ``[B, 3, S, S]`` plus labels). Where the work runs differs:

* **DataLoader, JPEG files**: ``--cpus`` worker processes each read a file and run
  ``TrainViews(dtype="float32")`` (decode, crops, normalisation) on it; the main process collates.
* **Ray Data** (``build_datasets``, default ``PipelineConfig``): read tasks (1 logical CPU each, ``--cpus``
  logical CPUs in all; one per ~2048 rows of a shard) read the parquet rows and decode them in the same
  task, 64-row blocks on 2 threads (``TrainViews(dtype="uint8")``: decode + crops), and put each block's
  uint8 views in the object store as soon as it is done; the consumer (``iter_torch_batches`` with
  ``ToTorch``, in Ray's prefetch thread in this process) normalises them to float32. This is what a Ray
  Train worker runs through ``PairedBatches``.
* **Ray Data, separate decode step**: the design before 2026-11-26 (``decode_in_read_tasks=False``): read tasks
  cut the shards into 128-row blocks and ``map_batches`` tasks (1 logical CPU, 2 threads) decode them.
* **Ray Data, float32 transfer**: the same as the default, but the decode step normalises and ships float32 views
  (``PipelineConfig(transfer_dtype="float32")``, 4x the object-store bytes): the design before uint8 transfer.

Each path makes ``--passes`` epochs over the data, interleaved round by round (so a change in a shared
machine's load hits every path alike) and timed separately: pass 1 includes each path's own start-up (Ray
Data plans the read, opens the shards and starts its tasks; the DataLoader forks its workers); later
passes show the rate a multi-epoch training run sees. Not timed: ``ray.init``, one task per CPU (so Ray
starts that many worker processes) and one full warm-up pass of the default pipeline over the local shards,
through a Dataset object of its own (a training job has Ray's processes and Ray Data's per-process machinery
running already). With only a small warm-up dataset (320 images, before 2026-11-26 08:22 UTC) the first timed
Ray pass ran slower whichever path it was (S3 first: S3/local pass 1 0.83-0.87; local first: 1.19), so pass 1
compared the order, not the storage; with the full warm-up pass S3/local pass 1 is 0.93-1.00.

Two summaries are less sensitive to a shared machine's noise than the pooled rates: the **per-round ratio**
(each later round's images/s against the DataLoader's in the same round; median and range) and the **busy
CPU per image** (the whole machine's busy CPU seconds over a pass, from ``/proc/stat``, divided by its
images: what one image costs on that path, counting every process: driver, Ray workers, raylet, rclone,
DataLoader workers). Ray Data 2.60 also starts every execution (every epoch) with a resource limit of 0 CPUs
for about one second, until its autoscaling coordinator answers (``ResourceManager.get_global_limits``):
in that second it runs one task at a time, which ``decode_threads=2`` keeps on both cores.

The data are generated here: random-ish class-coloured JPEGs written once as a JPEG tree (for the
DataLoader) and once as a prepared dataset (parquet shards + manifest) on local disk and on a local
``rclone serve s3``.

    .venv/bin/python benchmarks/bench_data.py                 # 3000 images, 6 passes per path: ≈ 3 min
    .venv/bin/python benchmarks/bench_data.py --images 1200 --image-size 224 --passes 4 --cpus 2
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ncdlr.data.manifest import DatasetInfo  # noqa: E402
from ncdlr.data.records import ClassInfo, ImageRecord  # noqa: E402
from ncdlr.data.storage import S3Server  # noqa: E402


def make_jpegs(root: Path, n: int, size: int, classes: int, seed: int) -> list[tuple[Path, int]]:
    """``n`` JPEGs of ``size`` px: a class colour, a smooth gradient, noise and a few bright rectangles."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    colours = rng.integers(40, 216, (classes, 3))
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size
    files = []
    for i in range(n):
        label = int(i % classes)
        base = colours[label] + 60 * np.stack([xx, yy, 1 - xx], axis=-1) * rng.uniform(-1, 1, 3)
        pixels = base + rng.normal(0, 18, (size, size, 3))
        for _ in range(3):
            x, y = rng.integers(0, size - size // 4, 2)
            pixels[y:y + size // 4, x:x + size // 5] = rng.integers(0, 256, 3)
        path = root / f"class_{label:02d}" / f"{i:06d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(path, format="JPEG", quality=90)
        files.append((path, label))
    return files


def dataset_parts(files: list[tuple[Path, int]], root: Path, classes: int):
    counts = np.bincount([label for _, label in files], minlength=classes)
    infos = [ClassInfo(label=k, name=f"class_{k:02d}", group="known", train_count=int(counts[k])) for k in range(classes)]
    records = [ImageRecord(image=path.read_bytes(), label=label, split="known", class_name=f"class_{label:02d}",
                           source_id=str(path.relative_to(root))) for path, label in files]
    return records, infos, DatasetInfo(name="bench", source="benchmarks/bench_data.py", seed=0)


def _start_worker_body() -> int:
    """Runs in a Ray worker: import what the decode tasks import, hold the CPU briefly, return the pid."""
    import ncdlr.data.pipeline  # noqa: F401

    time.sleep(0.5)
    return os.getpid()


def ray_pass(dataset, batch_size: int) -> tuple[int, float]:
    """One epoch through the Ray pipeline as a trainer sees it: torch batches from ``iter_torch_batches``."""
    from ncdlr.data.pipeline import ToTorch

    start, rows = time.perf_counter(), 0
    for batch in dataset.iter_torch_batches(batch_size=batch_size, collate_fn=ToTorch(), prefetch_batches=2):
        rows += int(batch["view1"].shape[0])
    return rows, time.perf_counter() - start


class JpegFiles:
    """``torch.utils.data.Dataset`` over JPEG paths: decode, two crops and normalisation to float32 in the worker
    (``TrainViews(dtype="float32")``, the same per-image work as the Ray pipeline), one image at a time."""

    def __init__(self, files: list[tuple[Path, int]], views) -> None:
        self.files = files
        self.views = views

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int):
        import torch

        path, label = self.files[i]
        out = self.views({"image": np.array([path.read_bytes()], dtype=object)})
        return torch.from_numpy(out["view1"][0]), torch.from_numpy(out["view2"][0]), label


def busy_cpu_seconds() -> float | None:
    """CPU seconds this machine has spent busy so far (all processes: ``/proc/stat``), None where unavailable.

    The difference over a pass is every process's CPU for it (driver, Ray workers, raylet, rclone, DataLoader
    workers): the CPU one image costs on each path, which a shared machine's load changes much less than
    the wall time."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(x) for x in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def timed(run) -> tuple[int, float, float | None]:
    """``(rows, wall s, busy CPU s)`` of one pass."""
    before = busy_cpu_seconds()
    rows, seconds = run()
    after = busy_cpu_seconds()
    return rows, seconds, (after - before) if before is not None and after is not None else None


def dataloader_pass(loader) -> tuple[int, float]:
    start, rows = time.perf_counter(), 0
    for view1, _view2, _label in loader:
        rows += int(view1.shape[0])
    return rows, time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=3000, help="JPEGs to generate (one pass over all of them)")
    parser.add_argument("--source-size", type=int, default=256, help="side of the generated JPEGs, px")
    parser.add_argument("--image-size", type=int, default=224, help="crop side of each view, px")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--cpus", type=int, default=2,
                        help="Ray logical CPUs = DataLoader workers (default 2: this machine's cores)")
    parser.add_argument("--classes", type=int, default=20)
    parser.add_argument("--passes", type=int, default=6,
                        help="epochs per path; pass 1 includes start-up (>= 2 so later passes exist)")
    parser.add_argument("--workdir", type=Path, default=None, help="keep generated data here (default: a temp dir)")
    args = parser.parse_args()

    for key, value in {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled",
                       "RAY_DATA_DISABLE_PROGRESS_BARS": "1", "AWS_EC2_METADATA_DISABLED": "true"}.items():
        os.environ.setdefault(key, value)
    import ray
    import torch

    from ncdlr.data.pipeline import PipelineConfig, build_datasets
    from ncdlr.data.shards import write_dataset

    torch.set_num_threads(1)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench-data-"))
    jpeg_root = work / "jpeg"
    t0 = time.perf_counter()
    files = make_jpegs(jpeg_root, args.images, args.source_size, args.classes, seed=0)
    records, classes, info = dataset_parts(files, jpeg_root, args.classes)
    mean_kb = sum(len(r.image) for r in records) / len(records) / 1024
    print(f"generated {len(files)} JPEGs of {args.source_size}px (mean {mean_kb:.1f} KiB) in "
          f"{time.perf_counter() - t0:.1f}s under {work}")

    cfg = PipelineConfig(image_size=args.image_size, batch_size=args.batch_size, decode_batch_size=32, verify="size")
    results: dict[str, list[tuple[int, float]]] = {}
    baseline = f"DataLoader, JPEG files ({args.cpus} workers)"
    with S3Server(work / "s3") as server:
        os.environ.update(server.env())
        bucket = server.make_bucket("bench")
        local_uri, s3_uri = str(work / "prepared"), f"{bucket}/prepared"
        for uri in (local_uri, s3_uri):
            write_dataset(uri, records, classes, info, progress=False, overwrite=True)
        del records
        # address="local": a Ray of our own even when another cluster runs on this machine.
        ray.init(address="local", num_cpus=args.cpus, object_store_memory=1024**3, log_to_driver=False,
                 include_dashboard=False)
        _start_worker = ray.remote(num_cpus=1)(_start_worker_body)
        try:
            # Untimed warm-up (see the docstring): --cpus concurrent tasks, so that Ray starts that many worker
            # processes (Ray Data alone runs one task at a time for its first ~second and would start only
            # one), then one full pass of the default pipeline over the local shards through a Dataset object of
            # its own (the timed paths build theirs below, so each timed pass 1 still plans and starts its own).
            ray.get([_start_worker.remote() for _ in range(args.cpus)])
            ray_pass(build_datasets(local_uri, cfg, train_splits=("known",), eval_splits=())["known"], args.batch_size)
            paths = (("Ray Data, rclone S3", s3_uri, cfg), ("Ray Data, local disk", local_uri, cfg),
                     ("Ray Data, local disk, separate decode step", local_uri,
                      replace(cfg, decode_in_read_tasks=False, rows_per_block=128)),
                     ("Ray Data, local disk, float32 transfer", local_uri, replace(cfg, transfer_dtype="float32")))
            datasets = {name: build_datasets(uri, path_cfg, train_splits=("known",), eval_splits=())["known"]
                        for name, uri, path_cfg in paths}
            loader = torch.utils.data.DataLoader(JpegFiles(files, cfg.train_views("float32")),
                                                 batch_size=args.batch_size, shuffle=True, num_workers=args.cpus,
                                                 prefetch_factor=2, persistent_workers=True)
            runs = {**{name: (lambda ds=ds: ray_pass(ds, args.batch_size)) for name, ds in datasets.items()},
                    baseline: lambda: dataloader_pass(loader)}
            # Interleave the paths pass by pass (rotating who goes first) so that a change in the machine's
            # load hits all of them alike.
            names = list(runs)
            for round_ in range(args.passes):
                for name in names[round_ % len(names):] + names[:round_ % len(names)]:
                    results.setdefault(name, []).append(timed(runs[name]))
                    rows, seconds, _ = results[name][-1]
                    print(f"round {round_ + 1}: {name}: {rows} images in {seconds:.1f}s", flush=True)
            tasks = {name: "; ".join(line.strip().split(" in ")[0] for line in ds.stats().splitlines()
                                     if "tasks executed" in line) for name, ds in datasets.items()}
        finally:
            ray.shutdown()

    def rate(timings: list[tuple[int, float, float | None]], which: slice) -> float:
        chosen = timings[which]
        return sum(t[0] for t in chosen) / sum(t[1] for t in chosen)

    def round_ratios(timings, reference) -> list[float]:
        """Per-round images/s ratio against ``reference`` over the later passes (the same round saw the same load)."""
        return [(t[0] / t[1]) / (r[0] / r[1]) for t, r in zip(timings[1:], reference[1:])]

    def cpu_ms_per_image(timings) -> str:
        cpu = [t[2] for t in timings[1:]]
        return "n/a" if any(c is None for c in cpu) else f"{1000 * sum(cpu) / sum(t[0] for t in timings[1:]):.2f}"

    base = results[baseline]
    load = os.getloadavg()
    print(f"\n{platform.node()}: {os.cpu_count()} cores, load average {load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f}; "
          f"{args.images} images {args.source_size}px -> 2 views {args.image_size}px, batch {args.batch_size}, "
          f"{args.cpus} CPUs")
    first, later = slice(0, 1), slice(1, None)
    print("| path | images/pass | pass 1 s | later passes s (each) | images/s pass 1 | images/s later | "
          "vs DataLoader pass 1 | vs DataLoader later | per-round ratio, median (min–max) | busy CPU ms/image |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, t in results.items():
        ratios = round_ratios(t, base)
        print(f"| {name} | {t[0][0]} | {t[0][1]:.1f} | {' '.join(f'{x[1]:.1f}' for x in t[1:])} | "
              f"{rate(t, first):.1f} | {rate(t, later):.1f} | {rate(t, first) / rate(base, first):.2f}x | "
              f"{rate(t, later) / rate(base, later):.2f}x | {statistics.median(ratios):.2f}x "
              f"({min(ratios):.2f}–{max(ratios):.2f}) | {cpu_ms_per_image(t)} |")
    s3, local = results["Ray Data, rclone S3"], results["Ray Data, local disk"]
    print(f"\nS3 / local images/s: pass 1 {rate(s3, first) / rate(local, first):.2f}, "
          f"later passes {rate(s3, later) / rate(local, later):.2f}")
    for name, line in tasks.items():
        print(f"{name}: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
