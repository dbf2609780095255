"""GPU numbers (issue 4): the ViT-B/16 training step's images/s and its share of bf16 peak, and the OT step.

Usage (on a GPU machine; needs torch, timm, pyyaml, no Ray)::

    python benchmarks/bench_gpu.py --out DIR          # ≈ 1–2 min on an H100/H200
    python benchmarks/bench_gpu.py --smoke            # tiny sizes on CPU: checks the script runs

What runs, all in one process on one GPU, bf16 autocast (``optim.amp``):

1. **bf16 peak, measured**: an 8192³ bf16 matrix product (3 warm-ups, 10 timed with CUDA events) — the
   ceiling the step is compared against, beside the datasheet's dense-bf16 989 TFLOP/s (H100/H200 SXM).
2. **Training step** (:func:`ncdlr.service.train_loop.train_step`, the exact step the Ray Train workers run)
   at the paper's iNat18-2K size: ``vit_base_patch16_224``, last block trained (``trainable_blocks=1``),
   frozen random expansion head 768 → 2000, ETF prototypes, K = 1000 known + 1000 novel, B = 128 known +
   128 novel images per step (two views each: 512 crops of 224 px), buffer J = 2048 on the GPU, labeler
   L = 10, T = 3. Inputs are in-memory GPU tensors (no data loading: that is ``bench_data.py``'s job), so
   this is the compute ceiling of one worker. FLOPs per step are counted by
   ``torch.utils.flop_counter.FlopCounterMode`` (matmuls, attention, convolutions) over one step; the
   fraction of peak is counted FLOPs / step time / peak. Phase shares come from the loop's own timers
   (``ot_s`` = labeler call, ``exchange_s`` = gathering rows + buffer push), with the device synchronised
   at each phase boundary. The same step with the whole encoder trained (``trainable_blocks=-1``,
   B = 64 + 64) is shown for contrast.
3. **Embedding throughput**: ``ncdlr embed``'s forward pass (no grad, bf16), 512 images per batch.
4. **OT step alone**: the labeler at N = 2048 + 128 rows, Ku = 1000 (``bench_ot.py``'s problem) on the
   GPU: replayed as a captured CUDA graph (the default), eager forward mode, and the autograd path.
5. **Input path of one step** (4 × B crops of 224 px, host tensors as ``PairedBatches`` yields them): the
   float32 views normalised on the host (what a CPU worker gets) against uint8 views normalised on the
   device after the copy (what a GPU worker gets, ``PairedBatches(normalise=False)``): ``torch.cat`` + copy
   to the device (+ ``normalise_chw_torch``), synchronised; and the host-side normalisation the uint8 path
   saves (numpy, one thread; it runs in Ray's prefetch thread, off the step's critical path but on the
   worker's CPU).

Writes ``gpu.json`` and ``gpu.md`` to ``--out`` and prints the Markdown.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ncdlr.data.transforms import normalise_chw, normalise_chw_torch  # noqa: E402
from ncdlr.models import build_model  # noqa: E402
from ncdlr.labeler import AdaptiveSelfLabeler  # noqa: E402
from ncdlr.service.config import Config  # noqa: E402
from ncdlr.service.local import local_state  # noqa: E402
from ncdlr.service.train_loop import PairedBatch, train_step  # noqa: E402

DATASHEET_BF16_TFLOPS = 989.0  # H100/H200 SXM, dense bf16 (vendor datasheet)


@dataclass
class Sizes:
    encoder: str
    image: int
    known: int
    novel: int
    batch: int  # per half
    batch_full: int  # per half, whole encoder trained
    buffer: int
    embed_batch: int
    matmul: int
    warmup: int
    steps: int


FULL = Sizes("vit_base_patch16_224", 224, 1000, 1000, 128, 64, 2048, 512, 8192, 5, 20)
SMOKE = Sizes("tiny_cnn", 32, 10, 10, 8, 8, 64, 16, 256, 1, 3)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device: torch.device, warmup: int, reps: int) -> list[float]:
    """Seconds per call of ``fn`` (device synchronised around each call)."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(reps):
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        out.append(time.perf_counter() - start)
    return out


def matmul_peak(n: int, device: torch.device) -> float:
    """Measured bf16 TFLOP/s of an ``n³`` matrix product (mean of 10 after 3 warm-ups)."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    sync(device)
    start = time.perf_counter()
    for _ in range(10):
        a @ b
    sync(device)
    return 2 * n**3 * 10 / (time.perf_counter() - start) / 1e12


def step_config(sizes: Sizes, batch: int, trainable_blocks: int, speed: dict | None = None) -> Config:
    """The step's config; ``speed``: ``optim`` settings to switch on (``compile``, ``channels_last``)."""
    cfg = Config()
    cfg.model.encoder, cfg.model.trainable_blocks, cfg.model.head = sizes.encoder, trainable_blocks, "auto"
    cfg.data.batch_size, cfg.data.image_size = batch, sizes.image
    cfg.labeler.buffer_size = sizes.buffer
    cfg.optim.epochs, cfg.optim.warmup_epochs, cfg.optim.amp = 1, 0.1, True
    for key, value in (speed or {}).items():
        setattr(cfg.optim, key, value)
    return cfg


def train_step_numbers(sizes: Sizes, device: torch.device, batch: int, trainable_blocks: int,
                       speed: dict | None = None) -> dict:
    """Steps/s, images/s, phase shares and counted FLOPs of the real training step (``speed``: see
    :func:`step_config`; ``first_step_s`` is the first call, where ``compile`` compiles)."""
    import warnings

    from torch.utils.flop_counter import FlopCounterMode

    cfg = step_config(sizes, batch, trainable_blocks, speed)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no pre-trained weights": random weights time the same
        model = build_model(cfg.model, sizes.known, sizes.novel, image_size=sizes.image)
    state = local_state(cfg, model, 1000, device)  # with the buffer (J = cfg.labeler.buffer_size) on the device
    views = torch.randn(4, batch, 3, sizes.image, sizes.image, device=device)
    batch_obj = PairedBatch(views[0], views[1], torch.randint(0, sizes.known, (batch,), device=device),
                            torch.ones(batch, dtype=torch.bool, device=device), views[2], views[3],
                            torch.ones(batch, dtype=torch.bool, device=device))
    sync(device)
    first = time.perf_counter()
    train_step(state, batch_obj, cfg.optim)
    sync(device)
    first_step_s = time.perf_counter() - first
    for _ in range(sizes.warmup - 1):
        train_step(state, batch_obj, cfg.optim)
    stats = []
    sync(device)
    start = time.perf_counter()
    for _ in range(sizes.steps):
        stats.append(train_step(state, batch_obj, cfg.optim))
    sync(device)
    elapsed = time.perf_counter() - start
    state.forward = None  # FLOPs of the eager step: the same work, countable
    with FlopCounterMode(display=False) as counter:
        train_step(state, batch_obj, cfg.optim)
    flops = counter.get_total_flops()
    step_s = elapsed / sizes.steps
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    memory = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")
    return {
        "encoder": sizes.encoder, "trainable_blocks": trainable_blocks, "batch_per_half": batch,
        "crops_per_step": 4 * batch, "step_ms": step_s * 1e3, "steps_per_s": 1 / step_s,
        "images_per_s": 2 * batch / step_s, "crops_per_s": 4 * batch / step_s,
        "tflop_per_step": flops / 1e12, "achieved_tflops": flops / step_s / 1e12,
        "ot_share": statistics.fmean(s["ot_s"] for s in stats) / step_s,
        "exchange_share": statistics.fmean(s["exchange_s"] for s in stats) / step_s,
        "ot_ms": statistics.fmean(s["ot_s"] for s in stats) * 1e3,
        "tau_after": stats[-1]["tau"], "trainable_params_M": trainable / 1e6, "peak_memory_gib": memory,
        "first_step_s": first_step_s, "speed": dict(speed or {}),
    }


def embed_numbers(sizes: Sizes, device: torch.device) -> dict:
    """Forward-only images/s of the frozen encoder + head (``ncdlr embed``), bf16 autocast."""
    import warnings

    cfg = step_config(sizes, sizes.embed_batch, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = build_model(cfg.model, sizes.known, sizes.novel, image_size=sizes.image).to(device).eval()
    x = torch.randn(sizes.embed_batch, 3, sizes.image, sizes.image, device=device)

    @torch.no_grad()
    def forward():
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            model(x)

    seconds = statistics.median(timed(forward, device, sizes.warmup, sizes.steps))
    return {"batch": sizes.embed_batch, "ms_per_batch": seconds * 1e3, "images_per_s": sizes.embed_batch / seconds}


def ot_numbers(device: torch.device, smoke: bool) -> dict:
    n, k = (2048 + 128, 1000) if not smoke else (256, 50)
    g = torch.Generator().manual_seed(0)
    scores = (torch.rand(n, k, generator=g) * 2 - 1).to(device)
    graphed = AdaptiveSelfLabeler(k).to(device)
    fast = AdaptiveSelfLabeler(k).to(device)
    fast.cuda_graphs = False
    slow = AdaptiveSelfLabeler(k).to(device)
    slow.forward_mode = False
    out = {"rows": n, "clusters": k}
    for name, lab in (("graph_ms", graphed), ("forward_mode_ms", fast), ("autograd_ms", slow)):
        out[name] = statistics.median(timed(lambda: lab(scores, last=128), device, 3, 20)) * 1e3
    return out


def input_numbers(sizes: Sizes, device: torch.device) -> dict:
    """ms per step to bring 4 × B crops to the device: float32 (host-normalised) vs uint8 normalised on the device."""
    g = torch.Generator().manual_seed(0)
    raw = [torch.randint(0, 256, (sizes.batch, 3, sizes.image, sizes.image), generator=g, dtype=torch.uint8)
           for _ in range(4)]
    floats = [normalise_chw_torch(r, "imagenet") for r in raw]

    def float_path():
        return torch.cat(floats).to(device, non_blocking=True)

    def uint8_path():
        return normalise_chw_torch(torch.cat(raw).to(device, non_blocking=True), "imagenet")

    assert torch.equal(float_path().cpu(), uint8_path().cpu())  # the same inputs reach the model
    arrays = [r.numpy() for r in raw]
    out = {"crops": 4 * sizes.batch, "float32_mb": sum(f.numel() * 4 for f in floats) / 2**20,
           "uint8_mb": sum(r.numel() for r in raw) / 2**20}
    for name, fn in (("float32_ms", float_path), ("uint8_ms", uint8_path)):
        out[name] = statistics.median(timed(fn, device, 3, 20)) * 1e3
    out["host_normalise_ms"] = statistics.median(timed(lambda: [normalise_chw(a, "imagenet") for a in arrays],
                                                       torch.device("cpu"), 1, 5)) * 1e3
    return out


def markdown(result: dict) -> str:
    env = result["env"]
    lines = [f"device: {env['device']}, torch {env['torch']}, timm {env['timm']}, Python {env['python']}",
             f"bf16 matmul {result['peak']['n']}³ measured: {result['peak']['tflops']:.0f} TFLOP/s "
             f"(datasheet dense bf16 {DATASHEET_BF16_TFLOPS:.0f})", "",
             "| training step | crops/step | step ms | images/s | crops/s | TFLOP/step | TFLOP/s | of measured peak "
             "| of datasheet | OT share | exchange share | peak mem GiB |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in result["steps"]:
        label = f"{row['encoder']}, trainable_blocks={row['trainable_blocks']}, B={row['batch_per_half']}+{row['batch_per_half']}"
        lines.append(
            f"| {label} | {row['crops_per_step']} | {row['step_ms']:.1f} | {row['images_per_s']:.0f} | "
            f"{row['crops_per_s']:.0f} | {row['tflop_per_step']:.2f} | {row['achieved_tflops']:.0f} | "
            f"{row['achieved_tflops'] / result['peak']['tflops']:.1%} | "
            f"{row['achieved_tflops'] / DATASHEET_BF16_TFLOPS:.1%} | {row['ot_share']:.1%} | "
            f"{row['exchange_share']:.1%} | {row['peak_memory_gib']:.1f} |")
    e, o = result["embed"], result["ot"]
    lines += ["", f"embedding (forward only, bf16, batch {e['batch']}): {e['images_per_s']:.0f} images/s "
              f"({e['ms_per_batch']:.1f} ms per batch)",
              f"OT step alone (N={o['rows']}, Ku={o['clusters']}, L=10, T=3, median of 20 calls): CUDA graph "
              f"{o['graph_ms']:.2f} ms, eager forward-mode {o['forward_mode_ms']:.2f} ms, autograd {o['autograd_ms']:.2f} ms"]
    if "input" in result:
        i = result["input"]
        lines.append(f"input path of one step ({i['crops']} crops, median of 20): float32 views "
                     f"({i['float32_mb']:.0f} MiB) cat + copy {i['float32_ms']:.1f} ms; uint8 views ({i['uint8_mb']:.0f} MiB) "
                     f"cat + copy + normalise on the device {i['uint8_ms']:.1f} ms ({i['float32_ms'] / i['uint8_ms']:.1f}x); "
                     f"host normalisation saved {i['host_normalise_ms']:.1f} ms of one CPU thread per step")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="", help="directory for gpu.json and gpu.md (default: print only)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, runs on CPU: checks the script, no numbers")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type != "cuda" and not args.smoke:
        parser.error("no CUDA device: run on a GPU machine, or pass --smoke")
    sizes = SMOKE if args.smoke else FULL
    torch.backends.cuda.matmul.allow_tf32 = True
    import timm

    env = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
           "torch": torch.__version__, "timm": timm.__version__, "python": platform.python_version()}
    print(f"[bench_gpu] {env}", flush=True)
    result = {"env": env, "peak": {"n": sizes.matmul, "tflops": matmul_peak(sizes.matmul, device)}}
    print(f"[bench_gpu] peak {result['peak']}", flush=True)
    result["steps"] = []
    for batch, blocks in ((sizes.batch, 1), (sizes.batch_full, -1)):
        result["steps"].append(train_step_numbers(sizes, device, batch, blocks))
        print(f"[bench_gpu] step {result['steps'][-1]}", flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
    result["embed"] = embed_numbers(sizes, device)
    print(f"[bench_gpu] embed {result['embed']}", flush=True)
    result["ot"] = ot_numbers(device, args.smoke)
    result["input"] = input_numbers(sizes, device)
    write_result(result, markdown(result), args.out, "gpu")


def write_result(result: dict, text: str, out: str, name: str) -> None:
    """Print ``text``; with ``out``, also write ``<out>/<name>.json`` (``result``) and ``<out>/<name>.md`` (``text``)."""
    print(text)
    if out:
        os.makedirs(out, exist_ok=True)
        Path(out, f"{name}.json").write_text(json.dumps(result, indent=2))
        Path(out, f"{name}.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
