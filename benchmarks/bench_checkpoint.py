"""Per-epoch overhead of reporting and checkpointing: every epoch, sync (the old default) vs async upload vs the
wall-clock interval (the new default: a report and checkpoint at most once a minute, and after the last epoch).

Each mode is one real ``ncdlr.service.trainer.fit`` on the same small feature table (Ray Train, one CPU worker,
the shared buffer actor, ``--epochs`` short epochs, no evaluation), run in the same process, one after the
other and then again in reverse order (the machine may be shared); the faster of the two counts. The
overhead per epoch is ``(fit wall − the sum of the epochs' own training time) / epochs``: worker start-up is
in it too, so the baseline is the same run with sync checkpoints every epoch, and the ratio of wall times says
what the change buys. Ray Train's controller polls the workers every ``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S``
(default 2 s, kept here as in a user's run) and each ``ray.train.report`` waits for that poll. One JSON line per
mode, then a summary line.

Usage:  .venv/bin/python benchmarks/bench_checkpoint.py [--epochs 12] [--rows 4000] [--dim 384]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ncdlr.data.features import synthetic_features, write_feature_table  # noqa: E402
from ncdlr.service.config import Config  # noqa: E402

MODES = {  # name → (run.checkpoint_upload, run.checkpoint_every_s)
    "sync every epoch": ("sync", 0.0),
    "async every epoch": ("async", 0.0),
    "async every 60 s (default)": ("async", 60.0),
}


def config(table: str, out: Path, epochs: int, upload: str, every_s: float) -> Config:
    cfg = Config()
    cfg.data.features, cfg.data.batch_size = table, 128
    cfg.model.encoder, cfg.model.head = "identity", "mlp"
    cfg.optim.epochs, cfg.optim.warmup_epochs = epochs, 1
    cfg.labeler.buffer_size = 1024
    cfg.run.output, cfg.run.num_workers, cfg.run.cpus_per_worker = str(out), 1, 1.0
    cfg.run.evaluate, cfg.run.checkpoint_upload, cfg.run.checkpoint_every_s = False, upload, every_s
    return cfg


def run_mode(table: str, root: Path, name: str, epochs: int, repeat: int) -> dict:
    from ncdlr.service.trainer import fit

    upload, every_s = MODES[name]
    out = root / f"{name.replace(' ', '-')}-{repeat}"
    start = time.perf_counter()
    result = fit(config(table, out, epochs, upload, every_s))
    wall = time.perf_counter() - start
    checkpoints = len(list((out / "ray").rglob("state.pt")))
    train_s = float(result["metrics"]["epoch_s"]) * epochs  # the last epoch's training time, × epochs
    return {"mode": name, "wall_s": round(wall, 2), "train_s": round(train_s, 2),
            "overhead_s_per_epoch": round((wall - train_s) / epochs, 3), "checkpoints_kept": checkpoints}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--rows", type=int, default=4000, help="about this many training rows (long-tailed)")
    parser.add_argument("--dim", type=int, default=384)
    args = parser.parse_args(argv)

    import ray

    from ncdlr.service.entry import with_worker_setup

    with tempfile.TemporaryDirectory(prefix="bench-checkpoint-") as tmp:
        root = Path(tmp)
        x, y, s = synthetic_features(num_known=50, num_novel=50, dim=args.dim, n_max=max(20, args.rows // 25),
                                     ratio=10, test_per_class=2, seed=0)
        table = str(root / "features.parquet")
        write_feature_table(table, x, y, s, num_known=50, num_novel=50)
        ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False, logging_level="WARNING",
                 runtime_env=with_worker_setup(None))  # as ncdlr's own Ray: ncdlr.service.worker_setup
        best: dict[str, dict] = {}
        for repeat, order in enumerate((list(MODES), list(reversed(MODES)))):
            for name in order:
                row = run_mode(table, root, name, args.epochs, repeat)
                print(json.dumps(row), flush=True)
                if name not in best or row["wall_s"] < best[name]["wall_s"]:
                    best[name] = row
        ray.shutdown()
    base = best["sync every epoch"]
    print(json.dumps({name: {"wall_s": row["wall_s"], "overhead_s_per_epoch": row["overhead_s_per_epoch"],
                             "wall_vs_sync": round(row["wall_s"] / base["wall_s"], 3)}
                      for name, row in best.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
