"""Issue 14's GPU rows: image-mode training of a dataset config, ncdlr against UNO, seed by seed, in one GPU call.

Each run is the service's own (``ncdlr.service.trainer.fit``: Ray Train with one worker, Ray Data streaming the
prepared shards, the buffer actor, the end-of-run evaluation on the test split), built from the same command line a
user types::

    ncdlr train --config CONFIG --data.uri DATA --num-workers 1 --batch-size B --epochs E --seed S \\
        [--method.name uno]

so UNO on a config that sets ncdlr's options (relaxed sizes, the block term, the class-balanced known loss) trains
as published (the config's ``file_resets``). Ray starts once for all the runs. Runs go seed by seed, both methods
of a seed before the next, and a seed is started only if the time left (``--budget-s``) holds another pair at the
last pair's pace, so what a short GPU lease leaves is always paired.

Printed: one JSON line per run (``method``, ``seed``, ``novel``, ``known``, ``all``, ``novel_head/medium/tail``
in %, class-mean over the test split, one Hungarian matching over all classes (method.md §5), the last epoch's
``steps_per_s`` and ``data_share``, ``seconds`` of the whole run, ``device``), then a table: each method's mean ±
std over the seeds (ddof 0, as docs/results.md) and the paired gap ``ncdlr − uno`` with its SE over seeds
(``std(ddof=1) / sqrt(n)``). ``--out DIR`` also writes ``gpu_quality.jsonl`` there.

The cached regime to set beside these rows is measured on CPU on the same prepared data (docs/results.md):
``ncdlr embed --data DATA … --trainable-blocks 1 --views 8`` then ``benchmarks/quality.py --table
openclipart-cached=CACHE``. Preparing a copy small enough to carry to the GPU machine (with ``gpu-bundle
--with-lite0``, ≤ 64 MiB in all) and the one call are in ``benchmarks/gpu_issue14_15.sh`` (five seeds at once;
``gpu_issue14.sh`` runs them one after another).

Usage::

    python3 benchmarks/gpu_quality.py --data .gpu-data/oc160 --seeds 3 --budget-s 420 --out $OUT   # on a GPU
    python3 benchmarks/gpu_quality.py --data .gpu-data/oc160 --seed-start 3 --seeds 1 --object-store-gb 4 \
        --jsonl /tmp/q/s3.jsonl &      # one seed's pair per process, several at once on one GPU
    python3 benchmarks/gpu_quality.py --summarize /tmp/q/*.jsonl       # their rows, merged, and the table
    python benchmarks/gpu_quality.py --smoke      # tiny synthetic images on CPU, one epoch (CI): the wiring only

Several processes at once (``--seed-start S --seeds 1`` each, each its own local Ray with ``--object-store-gb``
capping its object store) share one GPU: an efficientnet_lite0 step at 160 px should leave most of an H200 idle,
and on CPU a short run's wall time is mostly Ray Train's start (≈ 20 s, docs/benchmarks.md) and each epoch's Ray
Data start, which concurrent runs overlap (``benchmarks/gpu_issue14_15.sh``; not yet timed on a GPU). Their ``seconds``, ``steps_per_s`` and ``data_share`` then measure runs that
share the machine, not one run's pace.

With ``--smoke`` the numbers mean nothing; the run checks that every key is produced and the pairing holds.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent)]

METHODS = ("ncdlr", "uno")
RESULT_KEYS = ("novel", "known", "all", "novel_head", "novel_medium", "novel_tail")


def run_arguments(config: str, data: str, method: str, seed: int, *, epochs: int, batch_size: int, use_gpu: bool,
                  cpus_per_worker: float, output: Path, extra: list[str]) -> list[str]:
    """The ``ncdlr train`` command line of one run (both seeds: the run's and the prototypes')."""
    argv = ["--config", config, "--data.uri", data, "--run.num_workers", "1", "--data.batch_size", str(batch_size),
            "--optim.epochs", str(epochs), "--run.seed", str(seed), "--model.prototype_seed", str(seed),
            "--run.use_gpu", "true" if use_gpu else "false", "--run.cpus_per_worker", str(cpus_per_worker),
            "--output", str(output), "--overwrite", *extra]
    if method == "uno":
        argv += ["--method.name", "uno"]
    elif method != "ncdlr":
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    return argv


def train_one(argv: list[str]) -> dict:
    """Build the config exactly as ``ncdlr train`` does and run it; the service's summary dict."""
    from ncdlr.commands.train import add_arguments, build_config
    from ncdlr.service.trainer import fit

    parser = argparse.ArgumentParser(prog="ncdlr train")
    add_arguments(parser)
    return fit(build_config(parser.parse_args(argv)))


def run_record(method: str, seed: int, result: dict, device: str, epochs: int) -> dict:
    """One JSON line: the test metrics in %, the last epoch's pace and the run's seconds."""
    test, train = result.get("test", {}), result.get("metrics", {})
    record = {"method": method, "seed": seed, "epochs": epochs, "device": device}
    for key in RESULT_KEYS:
        value = test.get(key)
        record[key] = None if value is None else round(100.0 * float(value), 2)
    record["steps_per_s"] = train.get("steps_per_s")
    record["data_share"] = train.get("data_share")
    record["seconds"] = round(float(result.get("seconds", 0.0)), 1)
    return record


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and std over the seeds (ddof 0, as docs/results.md's tables)."""
    return statistics.fmean(values), statistics.pstdev(values)


def paired_gap(records: list[dict], a: str = "ncdlr", b: str = "uno", key: str = "novel") -> dict | None:
    """``a − b`` on ``key`` over the seeds both finished: mean, SE over seeds (ddof 1), n; None under 2 pairs."""
    by = {(r["method"], r["seed"]): r[key] for r in records if r.get(key) is not None}
    diffs = [by[(a, s)] - by[(b, s)] for (m, s) in sorted(by) if m == a and (b, s) in by]
    if len(diffs) < 2:
        return None
    se = statistics.stdev(diffs) / math.sqrt(len(diffs))
    return {"key": key, "gap": round(statistics.fmean(diffs), 2), "se": round(se, 2), "seeds": len(diffs)}


def summary_table(records: list[dict]) -> str:
    lines = ["| method | seeds | novel | known | all | novel head / medium / tail | s per run | data share |",
             "|---|---|---|---|---|---|---|---|"]
    for method in METHODS:
        rows = [r for r in records if r["method"] == method and r["novel"] is not None]
        if not rows:
            continue
        cell = {k: mean_std([r[k] for r in rows if r[k] is not None] or [float("nan")]) for k in RESULT_KEYS}
        shares = [r["data_share"] for r in rows if r["data_share"] is not None]
        lines.append(f"| {method} | {[r['seed'] for r in rows]} | " + " | ".join(
            f"{cell[k][0]:.1f} ± {cell[k][1]:.1f}" for k in ("novel", "known", "all")) + " | "
            + " / ".join(f"{cell[k][0]:.1f}" for k in ("novel_head", "novel_medium", "novel_tail"))
            + f" | {sum(r['seconds'] for r in rows) / len(rows):.0f} | "
            + (f"{sum(shares) / len(shares):.2f}" if shares else "") + " |")
    for key in ("novel", "known"):
        gap = paired_gap(records, key=key)
        if gap:
            lines.append(f"\nncdlr − uno, {key}: {gap['gap']:+.1f} (SE {gap['se']:.1f}) "
                         f"over {gap['seeds']} paired seeds")
    return "\n".join(lines)


def read_records(paths: list[Path]) -> list[dict]:
    """The JSON lines of several runs' files (``--jsonl``), ordered by seed then method; a cut-off last line is
    skipped, and so is a missing file (a process that died before its first run), each with a line on stderr."""
    records = []
    for path in paths:
        if not path.is_file():
            print(f"gpu_quality: no rows from {path}: the file is missing", file=sys.stderr)
            continue
        for line in path.read_text().splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:  # a process killed while writing its last line
                print(f"gpu_quality: skipped a partial line of {path}", file=sys.stderr)
    order = {m: i for i, m in enumerate(METHODS)}
    return sorted(records, key=lambda r: (r["seed"], order.get(r["method"], len(order))))


def smoke_dataset(root: Path) -> str:
    """Six synthetic classes of 64-px JPEGs (three known, three novel, imbalance 4), prepared as the service reads."""
    from ncdlr.data.builders import synthetic

    uri = str(root / "synthetic")
    synthetic.build(synthetic.SyntheticConfig(num_classes=6, ratio=4.0, n_max=16, test_per_class=3, image_size=64),
                    uri, progress=False)
    return uri


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="Runs and their order: see the module docstring (python -m pydoc).")
    parser.add_argument("--data", help="the prepared dataset (local folder or s3://), e.g. .gpu-data/oc160")
    parser.add_argument("--config", default=str(HERE.parent / "configs" / "openclipart.yaml"),
                        help="the dataset config both methods start from (default configs/openclipart.yaml)")
    parser.add_argument("--seeds", type=int, default=3,
                        help="seeds S..S+N-1 with S = --seed-start (issue 14 asks ≥ 3; default 3)")
    parser.add_argument("--seed-start", type=int, default=0, help="the first seed (default 0)")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--epochs", type=int, default=10, help="the cached cells' epochs (default 10)")
    parser.add_argument("--batch-size", type=int, default=64,
                        help="B known + B novel images a step on the one worker: the config's step (32 × 2 "
                             "workers) and the cached cells' (default 64)")
    parser.add_argument("--cpus-per-worker", type=float, default=4.0,
                        help="CPUs the GPU worker reserves; the rest decode and crop in Ray Data (default 4)")
    parser.add_argument("--budget-s", type=float, default=420.0,
                        help="start a seed only if another pair fits at the last pair's pace (default 420)")
    parser.add_argument("--out", type=Path, default=None, help="folder for gpu_quality.jsonl (e.g. $OUT)")
    parser.add_argument("--jsonl", type=Path, default=None,
                        help="write the rows to this file instead of OUT/gpu_quality.jsonl (one per process)")
    parser.add_argument("--object-store-gb", type=float, default=None,
                        help="cap this process's local Ray object store (several processes on one machine)")
    parser.add_argument("--summarize", type=Path, nargs="+", default=None, metavar="JSONL",
                        help="train nothing: merge these files' rows, print them and the table "
                             "(with --out, also write them to OUT/gpu_quality.jsonl)")
    parser.add_argument("--smoke", action="store_true", help="tiny synthetic images on CPU, one epoch: the wiring")
    parser.add_argument("--cpu", action="store_true",
                        help="the same full-size runs on the CPU, where no GPU is lent (fp32, no autocast; about "
                             "20 min a run alone on 2 cores with --cpus-per-worker 2, measured in session 46): "
                             "image mode against the cache on one machine's numerics")
    args = parser.parse_args(argv)
    if args.summarize:
        records = read_records(args.summarize)
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "gpu_quality.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        for record in records:
            print(json.dumps(record))
        if not records:
            print("gpu_quality: no rows to summarize", file=sys.stderr)
            return 1
        print(summary_table(records), flush=True)
        return 0

    import torch

    from ncdlr.service.entry import init_ray

    use_gpu = torch.cuda.is_available() and not (args.smoke or args.cpu)
    if not use_gpu and not (args.smoke or args.cpu):
        parser.error("no CUDA device: run on a GPU machine, or pass --cpu (full size, about 20 min a run on 2 cores) "
                     "or --smoke")
    if not args.data and not args.smoke:
        parser.error("--data is required (or --smoke)")
    device = torch.cuda.get_device_name(0) if use_gpu else "cpu"
    # the runs' folders are removed at the end; the rows go to stdout and --out
    with tempfile.TemporaryDirectory(prefix="gpu-quality-", ignore_cleanup_errors=True) as tmp:
        work = Path(tmp)
        data, epochs, batch, cpus, extra = args.data, args.epochs, args.batch_size, args.cpus_per_worker, []
        if args.smoke:
            data, epochs, batch, cpus = smoke_dataset(work), 1, 8, 1.0
            extra = ["--data.image_size", "64", "--labeler.buffer_size", "32"]
        print(f"gpu_quality: {device}; {args.config} on {data}; {args.seeds} seeds × {args.methods}; {epochs} "
              f"epochs, B = {batch} + {batch}; budget {args.budget_s:.0f} s", file=sys.stderr, flush=True)
        init_ray(cpus_needed=cpus + 2, object_store_bytes=int(args.object_store_gb * 2**30)
                 if args.object_store_gb else None)
        start, records, pair_s = time.perf_counter(), [], 0.0
        jsonl = args.jsonl or (args.out / "gpu_quality.jsonl" if args.out else None)
        if jsonl:
            jsonl.parent.mkdir(parents=True, exist_ok=True)
        sink = jsonl.open("w") if jsonl else None
        for seed in range(args.seed_start, args.seed_start + args.seeds):
            left = args.budget_s - (time.perf_counter() - start)
            if seed > args.seed_start and left < pair_s:
                print(f"gpu_quality: stopped before seed {seed}: {left:.0f} s left, a pair took {pair_s:.0f} s",
                      file=sys.stderr, flush=True)
                break
            pair_start = time.perf_counter()
            for method in args.methods:
                argv_run = run_arguments(args.config, data, method, seed, epochs=epochs, batch_size=batch,
                                         use_gpu=use_gpu, cpus_per_worker=cpus, output=work / f"{method}-s{seed}",
                                         extra=extra)
                record = {**run_record(method, seed, train_one(argv_run), device, epochs), "smoke": args.smoke}
                records.append(record)
                print(json.dumps(record), flush=True)
                if sink:
                    sink.write(json.dumps(record) + "\n")
                    sink.flush()
            pair_s = time.perf_counter() - pair_start
    print(summary_table(records), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
