"""The training step's speed settings one by one, and the two input designs' cost per step (issue 15).

Usage (on a GPU machine; needs torch, timm, torchvision, no Ray)::

    python benchmarks/bench_gpu_step.py --out DIR      # ≈ 2–3 min on an H100/H200 (inductor compiles twice)
    python benchmarks/bench_gpu_step.py --smoke        # tiny sizes on CPU: checks the script, no numbers
    python benchmarks/bench_gpu_step.py --input-only   # the input designs alone, full sizes, on any machine

1. **Step settings** (``optim.compile``, ``optim.channels_last``), each against the plain eager step measured in
   the same run (``bench_gpu.train_step_numbers``, in-memory inputs, bf16 autocast):
   ViT-B/16 at the paper's iNat18-2K sizes (last block trained, 128 + 128, K = 1000 + 1000) and
   efficientnet_lite0 at OpenClipart-LT's (160 px, last block, 64 + 64, K = 22 + 21). Printed per row: step
   ms, images/s, the ratio to the eager row, TFLOP/s and the share of the measured bf16 matmul peak, and the
   first call's seconds (where inductor compiles).
2. **Input designs**: what it costs to turn one step's 2B encoded JPEGs (B = 128, 320×240 to 500×375 px,
   as prepared shards hold them) into the 4B views: the host design (``TrainViews``: PIL decode + crops on
   one CPU thread; Ray Data spreads it over read tasks) as images/s per CPU core, and the device design
   (``DeviceTrainViews`` on the GPU: batched nvJPEG + roi_align) as ms of GPU-stream time per step, next to
   the step itself.

Writes ``gpu_step.json`` and ``gpu_step.md`` to ``--out`` and prints the Markdown.
"""

from __future__ import annotations

import argparse
import io
import platform
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

import bench_gpu  # noqa: E402

from ncdlr.data.device_views import DeviceTrainViews  # noqa: E402
from ncdlr.data.transforms import TrainViews, decode_rgb, detail_side  # noqa: E402

VIT = bench_gpu.FULL
LITE = replace(bench_gpu.FULL, encoder="efficientnet_lite0", image=160, known=22, novel=21, batch=64, batch_full=64)
SMOKE = bench_gpu.SMOKE
# Settings tried per encoder (channels-last only matters to convolutions: the ViT's one is its patch embedding)
VARIANTS = {"vit": ({}, {"compile": True}),
            "lite": ({}, {"channels_last": True}, {"compile": True, "channels_last": True})}


def photo_jpegs(n: int, rng: np.random.Generator, smoke: bool) -> list[bytes]:
    """``n`` photo-sized JPEGs (quality 90): smooth colour fields plus noise, sides drawn from 320×240–500×375."""
    from PIL import Image

    out = []
    for _ in range(n):
        w, h = (48, 40) if smoke else (int(rng.integers(320, 501)), int(rng.integers(240, 376)))
        x, y = np.linspace(0, 1, w)[None, :, None], np.linspace(0, 1, h)[:, None, None]
        pixels = 127 + 90 * np.sin(5 * x + 3 * y + rng.uniform(0, 6, (1, 1, 3))) + 12 * rng.standard_normal((h, w, 3))
        buffer = io.BytesIO()
        Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(buffer, format="JPEG", quality=90)
        out.append(buffer.getvalue())
    return out


def input_designs(device: torch.device, batch: int, size: int, smoke: bool) -> dict:
    """Host design: images/s of ``TrainViews`` on one CPU thread; device design: ms per step of ``DeviceTrainViews``."""
    data = photo_jpegs(2 * batch, np.random.default_rng(0), smoke)
    host = TrainViews(size=size, dtype="uint8", threads=1)
    column = np.array(data, dtype=object)
    host_s = statistics.median(bench_gpu.timed(lambda: host({"image": column}), torch.device("cpu"), 1, 3))
    keep = detail_side(size, host.crop_scale)
    decode_s = statistics.median(bench_gpu.timed(lambda: [decode_rgb(d, min_side=keep) for d in data],
                                                 torch.device("cpu"), 1, 3))
    views = DeviceTrainViews(size=size)
    device_s = statistics.median(bench_gpu.timed(lambda: views(data, device), device, 2, 10))
    return {"images": len(data), "mean_jpeg_kb": sum(map(len, data)) / len(data) / 1024,
            "host_images_per_s_per_core": len(data) / host_s,
            "host_decode_ms_per_image": decode_s / len(data) * 1e3,
            "host_crops_ms_per_image": (host_s - decode_s) / len(data) * 1e3,
            "device_ms_per_step": device_s * 1e3, "device_images_per_s": len(data) / device_s,
            "device": str(device)}


def markdown(result: dict) -> str:
    env, peak = result["env"], result["peak_tflops"]
    lines = [f"device: {env['device']}, torch {env['torch']}; bf16 matmul measured {peak:.0f} TFLOP/s", "",
             "| step | settings | step ms | images/s | vs eager | TFLOP/s | of measured peak | first call s |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for row in result["steps"]:
        base = next(r for r in result["steps"] if r["encoder"] == row["encoder"] and not r["speed"])
        name = ", ".join(k for k, v in row["speed"].items() if v) or "eager"
        lines.append(f"| {row['encoder']}, B={row['batch_per_half']}+{row['batch_per_half']} | {name} | "
                     f"{row['step_ms']:.1f} | {row['images_per_s']:.0f} | {row['images_per_s'] / base['images_per_s']:.2f}x | "
                     f"{row['achieved_tflops']:.0f} | {row['achieved_tflops'] / peak:.1%} | {row['first_step_s']:.1f} |")
    i = result["input"]
    lines += ["", input_line(result["input"])]
    return "\n".join(lines)


def input_line(i: dict) -> str:
    return (f"input designs, one step's {i['images']} JPEGs (mean {i['mean_jpeg_kb']:.0f} KiB): host (PIL decode "
            f"+ two crops, one CPU thread) {i['host_images_per_s_per_core']:.0f} images/s per core = decode "
            f"{i['host_decode_ms_per_image']:.2f} ms + crops {i['host_crops_ms_per_image']:.2f} ms an image; "
            f"device on {i['device']} (batch decode + roi_align) {i['device_ms_per_step']:.1f} ms per step = "
            f"{i['device_images_per_s']:.0f} images/s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="", help="directory for gpu_step.json and gpu_step.md (default: print only)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on CPU: checks the script, no numbers")
    parser.add_argument("--encoders", default="vit,lite", help="comma list of vit, lite (default both)")
    parser.add_argument("--input-only", action="store_true",
                        help="only the input designs' cost at full sizes, on this machine's device (CPU without a GPU)")
    args = parser.parse_args(argv)
    if args.input_only:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        print(input_line(input_designs(device, VIT.batch, VIT.image, False)))
        return 0
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    if device.type != "cuda" and not args.smoke:
        parser.error("no CUDA device: run on a GPU machine, or pass --smoke")
    torch.backends.cuda.matmul.allow_tf32 = True
    env = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
           "torch": torch.__version__}
    result = {"env": env, "peak_tflops": bench_gpu.matmul_peak(SMOKE.matmul if args.smoke else VIT.matmul, device),
              "steps": []}
    chosen = {"vit": VIT, "lite": LITE}
    for name in args.encoders.split(","):
        sizes = replace(SMOKE, steps=2) if args.smoke else chosen[name]
        for speed in VARIANTS[name]:
            if args.smoke and speed.get("compile"):
                continue  # inductor's CPU build takes minutes on 2 cores; the GPU run is the one that counts
            start = time.perf_counter()
            row = bench_gpu.train_step_numbers(sizes, device, sizes.batch, 1, speed)
            row["encoder"] = f"{row['encoder']}" if not args.smoke else f"{name}:{row['encoder']}"
            result["steps"].append(row)
            print(f"[bench_gpu_step] {row['encoder']} {speed or 'eager'}: {row['step_ms']:.1f} ms/step "
                  f"({time.perf_counter() - start:.0f} s)", flush=True)
            if device.type == "cuda":
                torch._dynamo.reset()
                torch.cuda.empty_cache()
    sizes = SMOKE if args.smoke else VIT
    result["input"] = input_designs(device, sizes.batch, sizes.image, args.smoke)
    bench_gpu.write_result(result, markdown(result), args.out, "gpu_step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
