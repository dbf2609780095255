"""End-to-end Ray Train runs (slow; kept to five TorchTrainer runs in all).

1. Image mode: 2 CPU DDP workers stream a tiny prepared dataset (with one corrupt JPEG) from the real rclone
   S3 server, train, evaluate and write the report; τ is identical on both ranks. The images are decoded and
   augmented by the GPU input path (``data.decode_on = device``), here on the workers' CPU device: CI has no
   GPU (tests/test_gpu.py runs it on CUDA); the host path's end-to-end run is tests/service/test_train_inat2k.py.
2. Feature-table mode through the CLI with run storage and checkpoints on ``s3://`` (the rclone server;
   see ``ncdlr.data.storage.ImplicitDirsS3Handler`` for why Ray gets our own filesystem there), then a
   resumed run that continues from that checkpoint (buffer actor re-seeded, epochs and steps carried on).
3. The feature-table run on a simulated 2-node Ray cluster (ray.cluster_utils.Cluster, in a subprocess).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ncdlr.data.records import ImageRecord
from ncdlr.data.shards import write_dataset
from ncdlr.service.checkpoint import load_checkpoint
from ncdlr.service.config import Config
from ncdlr.data.features import synthetic_features, write_feature_table
from tests.fixtures.tiny_images import make_tiny_dataset

pytestmark = pytest.mark.slow
ROOT = Path(__file__).parents[2]


@pytest.fixture
def feature_table(tmp_path) -> str:
    x, y, s = synthetic_features(num_known=5, num_novel=5, dim=16, n_max=40, ratio=4, test_per_class=6, seed=3)
    path = str(tmp_path / "features.parquet")
    write_feature_table(path, x, y, s, num_known=5, num_novel=5)
    return path


def test_two_workers_train_on_images_from_s3_and_write_the_report(ray_local, s3_bucket, tmp_path):
    from dataclasses import replace

    from ncdlr.service.trainer import fit

    records, classes, info = make_tiny_dataset(train_counts=(16, 8, 12, 12), num_known=2, test_per_class=3, size=40)
    broken = next(r for r in records if r.split == "novel" and r.label == 3)
    records = [r for r in records if r is not broken] + [ImageRecord(b"\xff\xd8 truncated", 3, "novel", broken.class_name,
                                                                     "corrupt/0001.jpg")]
    uri = f"{s3_bucket}/tiny"
    write_dataset(uri, records, classes, replace(info, name="tiny-e2e"), progress=False)

    cfg = Config()
    cfg.data.uri, cfg.data.batch_size, cfg.data.image_size, cfg.data.eval_batch_size = uri, 4, 32, 16
    cfg.data.decode_on = "device"
    cfg.model.encoder, cfg.model.trainable_blocks, cfg.model.head = "tiny_cnn", -1, "linear"
    cfg.labeler.gamma, cfg.labeler.buffer_size = 5.0, 32
    cfg.optim.epochs, cfg.optim.warmup_epochs = 2, 1
    cfg.run.num_workers, cfg.run.cpus_per_worker, cfg.run.output = 2, 1.0, str(tmp_path / "run")
    result = fit(cfg)

    assert result["metrics"]["epoch"] == 2
    assert result["metrics"]["tau_rank_spread"] == 0.0
    assert result["metrics"]["bad_images"] == 1  # the corrupt JPEG, counted once per epoch over both ranks
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert 0.0 <= metrics["novel"] <= 1.0 and metrics["steps"] == 6
    for name in ("config.yaml", "predictions.parquet", "summary.md"):
        assert (tmp_path / "run" / name).is_file(), name
    assert any((tmp_path / "run" / "tensorboard").iterdir())


def test_two_workers_stream_two_epochs_per_execution_in_lockstep(ray_local, tmp_path):
    """``data.epochs_per_execution = 2``: one Ray Data execution holds both epochs, cut into epochs of the same
    number of steps on both DDP ranks (no rank waits for a stream restart the other never asks for), and τ
    stays identical on both. The anchored prior's ``max_imbalance`` 0 is the known classes' training imbalance
    (16 / 8), filled in by the driver and recorded in the run's config."""
    from ncdlr.service.config import load_config
    from ncdlr.service.trainer import fit

    records, classes, info = make_tiny_dataset(train_counts=(16, 8, 12, 12), num_known=2, test_per_class=3, size=40)
    write_dataset(str(tmp_path / "tiny"), records, classes, info, progress=False)
    cfg = Config()
    cfg.data.uri, cfg.data.batch_size, cfg.data.image_size, cfg.data.eval_batch_size = str(tmp_path / "tiny"), 4, 32, 16
    cfg.data.epochs_per_execution = 2
    cfg.model.encoder, cfg.model.trainable_blocks, cfg.model.head = "tiny_cnn", -1, "linear"
    cfg.labeler.gamma, cfg.labeler.buffer_size, cfg.labeler.prior = 5.0, 32, "anchored"
    cfg.optim.epochs, cfg.optim.warmup_epochs = 2, 1
    cfg.run.num_workers, cfg.run.cpus_per_worker, cfg.run.output = 2, 1.0, str(tmp_path / "run")
    cfg.run.evaluate = False
    result = fit(cfg)
    assert result["metrics"]["epoch"] == 2 and result["metrics"]["steps"] == 3, "24 novel rows / (2 ranks × 4)"
    assert result["metrics"]["tau_rank_spread"] == 0.0
    assert load_config(tmp_path / "run" / "config.yaml").labeler.max_imbalance == 2.0


def test_feature_table_run_on_s3_storage_resumes_from_its_checkpoint(ray_local, feature_table, s3_bucket, tmp_path,
                                                                    capsys):
    """Run storage and checkpoints on ``s3://`` (the rclone server), and a second run resumes from there; the
    terminal shows our epoch lines (relayed from rank 0), which also go to the run's ``train.log``. Half of the
    first epoch is the known-class warm-up, so the shared buffer actor's clock (self-labeling steps only) is
    restored at another step than the training step's. The resumed run keeps a moving average of the weights
    (``--average-epochs``), which its checkpoint holds beside the last iterate."""
    from ncdlr.cli import main

    common = ["--features", feature_table, "--num-workers", "2", "--batch-size", "8", "--gamma", "5",
              "--buffer-size", "64", "--warmup-epochs", "1", "--evaluate", "false", "--known-warmup-epochs", "0.5",
              "--storage-path", f"{s3_bucket}/runs"]
    assert main(["train", *common, "--epochs", "1", "--output", str(tmp_path / "first")]) == 0
    first = (tmp_path / "first" / "checkpoint.txt").read_text().strip()
    assert first.startswith(f"{s3_bucket}/runs/")
    shown = capsys.readouterr().out
    assert "[ncdlr] epoch 1/1 done in" in shown and "RayTrainWorker" not in shown
    assert "[ncdlr] epoch 1/1 done in" in (tmp_path / "first" / "train.log").read_text()
    # the resumed run also keeps a moving average of the weights, started over from the restored ones
    assert main(["train", *common, "--epochs", "3", "--resume", first, "--output", str(tmp_path / "second"),
                 "--average-epochs", "0.5"]) == 0
    second_uri = (tmp_path / "second" / "checkpoint.txt").read_text().strip()
    assert second_uri.startswith(f"{s3_bucket}/runs/") and second_uri != first
    second = load_checkpoint(second_uri)
    before = load_checkpoint(first)
    assert second["epoch"] == 3 and second["step"] == 3 * before["step"]
    assert len(second["tau_history"]) == second["step"]
    assert second["tau_history"][: before["step"]] == before["tau_history"]
    warmup = round(0.5 * before["step"])
    assert before["tau_history"][:warmup] == [pytest.approx(2.0)] * warmup  # τ waits at its start (t = 0) ...
    assert before["tau_history"][-1] != pytest.approx(2.0)  # ... then learns
    assert "average" not in before and second["average"]["n_averaged"] == 2 * before["step"]
    assert second["average"]["model"].keys() == second["model"].keys()
    assert second["buffer"]["rows"].shape == before["buffer"]["rows"].shape
    assert not torch.equal(second["buffer"]["rows"], before["buffer"]["rows"])


MULTI_NODE = r"""
import json, sys
import ray
from ray.cluster_utils import Cluster
from ncdlr.service.config import Config
from ncdlr.service.entry import with_worker_setup
from ncdlr.service.trainer import fit

cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "object_store_memory": 128 * 1024**2})
cluster.add_node(num_cpus=2, object_store_memory=128 * 1024**2)
ray.init(address=cluster.address, log_to_driver=False, runtime_env=with_worker_setup(None))  # as init_ray
cfg = Config()
cfg.data.features, cfg.data.batch_size = sys.argv[1], 8
cfg.model.encoder, cfg.model.head = "identity", "mlp"
cfg.labeler.gamma, cfg.labeler.buffer_size = 5.0, 64
cfg.optim.epochs, cfg.optim.warmup_epochs = 2, 1
cfg.run.num_workers, cfg.run.cpus_per_worker, cfg.run.output = 2, 1.5, sys.argv[2]  # 1.5 CPU: one worker per node
try:  # two nodes and a local checkpoint path: refused before training
    fit(cfg)
    print("REFUSED none")
except ValueError as err:
    print("REFUSED " + str(err).replace("\n", " "))
import os; assert not os.path.exists(sys.argv[2]), "a refused run wrote its directory"
cfg.run.shared_storage = True  # honest here: the simulated nodes share one disk
result = fit(cfg)
nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
print("RESULT " + json.dumps({"metrics": result["metrics"], "test": result["test"], "nodes": len(nodes)}))
ray.shutdown()
cluster.shutdown()
"""


def test_same_run_on_a_simulated_two_node_cluster(feature_table, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", MULTI_NODE, feature_table, str(tmp_path / "run")], env=env,
                          capture_output=True, text=True, timeout=400, cwd=ROOT)
    line = next((l for l in proc.stdout.splitlines() if l.startswith("RESULT ")), None)
    assert line is not None, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(line[len("RESULT "):])
    refused = next(l for l in proc.stdout.splitlines() if l.startswith("REFUSED "))
    assert "is a local path, but this Ray cluster has 2 nodes" in refused, refused
    assert result["nodes"] == 2
    assert result["metrics"]["epoch"] == 2 and result["metrics"]["tau_rank_spread"] == 0.0
    assert 0.0 <= result["test"]["novel"] <= 1.0
