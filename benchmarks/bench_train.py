"""Training-loop throughput: the Ray Train loop vs a plain single-process PyTorch loop, same model and data.

Usage::

    .venv/bin/python benchmarks/bench_train.py                      # defaults below, ≈ 2–3 min on 2 cores
    .venv/bin/python benchmarks/bench_train.py --rows 4000 --dim 384 --epochs 2

Both loops run the same step (:func:`ncdlr.service.train_loop.train_step`: MLP head over in-memory features,
ETF prototypes, swapped pseudo-labels from the adaptive self-labeler over a J-row buffer) on the same
synthetic long-tailed feature table, with one torch thread per worker:

* **plain**: one process, the buffer is a local ``LogitBuffer``, no Ray;
* **plain in Ray task**: the same plain loop run as a 1-CPU Ray task (a Ray worker process, no Ray Train):
  separates the cost of running in a Ray worker process from the cost of the Ray Train loop;
* **ray W=1**: ``TorchTrainer`` with one worker; each rank keeps a local replica of the buffer and rank 0
  pushes each step's rows to the shared ``BufferActor`` from a sender thread; per-epoch checkpoint +
  ``ray.train.report``;
* **ray W=2**: two workers (gloo ``all_gather`` of the novel logits + DDP gradient all-reduce);
* **plain, H heads** (``--heads H`` > 1): the plain loop with ``model.heads = H`` (H heads on the features, one
  labeler each over ``H·Ku`` buffer columns), against the one-head plain loop of the same run.
* **plain, task W** (``--task-weight W`` > 0): the plain loop with ``method.task_weight = W`` (the known-vs-novel
  cross-entropy on every row of both views), against the plain loop of the same run without it.
* **plain, novel balance R** (``--novel-reweight R`` > 0): the plain loop with ``method.novel_reweight = R`` (the
  unlabelled rows weighted by their clusters' sizes in the solve: the labeler returns all J rows' labels, one more
  ``[J, Ku]`` pass), against the plain loop of the same run without it.

Steps/s are measured inside the epoch (the last epoch; the first pays warm-up); the plain loop runs before
and after the Ray runs and the faster of the two counts (the machine may be shared). Ray starts its worker
processes at nice 15; on a machine shared with other busy processes that alone makes any loop in a Ray
worker several times slower, so the benchmark starts Ray's workers at the plain loop's priority
(``--worker-niceness 0``; pass 15 for Ray's default). Ray Train's controller polls every worker each
``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S`` (default 2 s); at 0.1 s (what the tests use for fast reports) the
polling costs the workers ≈ 15 % (W=1) to 50 % (W=2) of their steps on 2 cores, so the benchmark keeps
Ray's default unless the variable is set. The shares of step time
spent in the buffer exchange (``all_gather``, replica push, rank 0's hand-off to the actor), in the OT step (labeler call) and waiting for
data come from the loop's own timers. Ray's fixed costs (``ray.init``, worker start, checkpoint+report per
epoch) are printed separately. Goals (issue 4): Ray loop ≥ 0.95× plain; exchange ≤ 2 %; OT ≤ 3 %; data ≤ 5 %.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch

from ncdlr.models import build_model
from ncdlr.service.config import Config
from ncdlr.data.features import read_feature_table, synthetic_features, write_feature_table
from ncdlr.service.local import local_state
from ncdlr.service.train_loop import feature_batches, run_epoch, steps_per_epoch


def make_config(args: argparse.Namespace, table: str, heads: int = 1, task_weight: float = 0.0,
                novel_reweight: float = 0.0) -> Config:
    cfg = Config()
    cfg.data.features, cfg.data.batch_size = table, args.batch_size
    cfg.model.encoder, cfg.model.head, cfg.model.feature_dim = "identity", "mlp", args.dim
    cfg.model.heads = heads
    cfg.method.task_weight, cfg.method.novel_reweight = task_weight, novel_reweight
    cfg.labeler.gamma, cfg.labeler.buffer_size = 10.0, args.buffer
    cfg.optim.epochs, cfg.optim.warmup_epochs = args.epochs, 1
    cfg.run.evaluate, cfg.run.log_every, cfg.run.cpus_per_worker = False, 0, 1.0
    return cfg


def plain(cfg: Config) -> dict:
    torch.set_num_threads(1)
    splits = read_feature_table(cfg.data.features)
    torch.manual_seed(0)
    model = build_model(cfg.model, splits.num_known, splits.num_novel)
    state = local_state(cfg, model, steps_per_epoch(splits.features["novel"].shape[0], cfg.data.batch_size, 1))
    metrics = {}
    for epoch in range(cfg.optim.epochs):
        metrics = run_epoch(state, feature_batches(splits, cfg.data, cfg.run.seed, epoch, 0, 1), cfg.optim)
    return metrics


def plain_in_ray_task(cfg: Config) -> dict:
    """The plain loop inside a 1-CPU Ray task: a Ray worker process, but no Ray Train, DDP or buffer actor."""
    import ray

    return ray.get(ray.remote(num_cpus=1)(plain).remote(cfg))


def ray_run(cfg: Config, workers: int, output: str) -> tuple[dict, float]:
    from ncdlr.service.trainer import fit

    cfg.run.num_workers, cfg.run.output = workers, output
    start = time.perf_counter()
    result = fit(cfg)
    return result["metrics"], time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--classes", type=int, default=200, help="K (half known, half novel)")
    parser.add_argument("--dim", type=int, default=768, help="feature width D (ViT-B: 768)")
    parser.add_argument("--n-max", type=int, default=120, help="head-class training rows per half")
    parser.add_argument("--batch-size", type=int, default=128, help="B per worker and per half (paper: 128)")
    parser.add_argument("--buffer", type=int, default=2048, help="J (paper: 2048)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--heads", type=int, default=1,
                        help="H > 1: also time the plain loop with model.heads = H (UNO's multi-head), against the "
                             "one-head plain loop of this run")
    parser.add_argument("--task-weight", type=float, default=0.0,
                        help="W > 0: also time the plain loop with method.task_weight = W (the known-vs-novel term), "
                             "against the plain loop of this run without it")
    parser.add_argument("--novel-reweight", type=float, default=0.0,
                        help="R > 0: also time the plain loop with method.novel_reweight = R (the pseudo-cluster-"
                             "balanced novel loss), against the plain loop of this run without it")
    parser.add_argument("--worker-niceness", type=int, default=0,
                        help="nice level of Ray's worker processes (Ray's default: 15). 0 = the plain loop's own "
                             "priority; at 15 a shared, loaded machine starves the Ray workers, not the plain loop")
    args = parser.parse_args()
    os.environ["RAY_worker_niceness"] = str(args.worker_niceness)  # read when ray.init starts the raylet

    import ray

    from ncdlr.service.entry import with_worker_setup

    with tempfile.TemporaryDirectory() as tmp:
        x, y, s = synthetic_features(num_known=args.classes // 2, num_novel=args.classes - args.classes // 2,
                                     dim=args.dim, n_max=args.n_max, ratio=10, test_per_class=2, seed=0)
        table = os.path.join(tmp, "features.parquet")
        write_feature_table(table, x, y, s, num_known=args.classes // 2, num_novel=args.classes - args.classes // 2)
        novel_rows = int((s == "novel").sum())
        print(f"data: {len(x)} rows, D={args.dim}, K={args.classes}, novel rows {novel_rows}; B={args.batch_size}, "
              f"J={args.buffer}, {args.epochs} epochs; torch threads per worker: 1; Ray worker niceness "
              f"{args.worker_niceness}; Ray Train health-check interval "
              f"{os.environ.get('RAY_TRAIN_HEALTH_CHECK_INTERVAL_S', '2 (default)')} s; load average {os.getloadavg()[0]:.1f}")
        base = plain(make_config(args, table))
        t0 = time.perf_counter()
        ray.init(address="local", num_cpus=4, object_store_memory=256 * 1024**2, include_dashboard=False, log_to_driver=False,
                 runtime_env=with_worker_setup(None))  # as ncdlr's own Ray: ncdlr.service.worker_setup
        init_s = time.perf_counter() - t0
        in_task = plain_in_ray_task(make_config(args, table))
        one, one_wall = ray_run(make_config(args, table), 1, os.path.join(tmp, "w1"))
        two, two_wall = ray_run(make_config(args, table), 2, os.path.join(tmp, "w2"))
        ray.shutdown()
        again = plain(make_config(args, table))  # the machine is shared: keep the faster of two plain runs
        base = max(base, again, key=lambda m: m["steps_per_s"])
        heads = plain(make_config(args, table, args.heads)) if args.heads > 1 else None
        task = plain(make_config(args, table, task_weight=args.task_weight)) if args.task_weight > 0 else None
        balance = (plain(make_config(args, table, novel_reweight=args.novel_reweight)) if args.novel_reweight > 0
                   else None)

    rows = [("plain (1 process)", base, None), ("plain in Ray task", in_task, None), ("ray W=1", one, one_wall),
            ("ray W=2", two, two_wall)] + ([(f"plain, {args.heads} heads", heads, None)] if heads else []) \
        + ([(f"plain, task {args.task_weight:g}", task, None)] if task else []) \
        + ([(f"plain, balance {args.novel_reweight:g}", balance, None)] if balance else [])
    print(f"\n{'loop':<18} {'steps/s':>8} {'vs plain':>9} {'rows/s':>8} {'exchange':>9} {'OT':>6} {'data':>6} "
          f"{'actor wait/step':>16} {'fit wall s':>10}")
    for name, m, wall in rows:
        workers = 2 if "W=2" in name else 1
        rate = m["steps_per_s"]
        print(f"{name:<18} {rate:8.2f} {rate / base['steps_per_s']:8.2f}x {rate * workers * 2 * args.batch_size:8.0f} "
              f"{100 * m['exchange_share']:8.1f}% {100 * m['ot_share']:5.1f}% {100 * m['data_share']:5.1f}% "
              f"{1000 * m.get('actor_wait_s_per_step', 0.0):13.2f} ms {wall if wall else 0:10.1f}")
    print(f"\nray.init {init_s:.1f} s; rows/s counts known+novel rows of all workers (2·W·B per step); "
          f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
