"""What can be checked before Ray starts is checked before Ray starts (``ncdlr.service.preflight``).

Each refusal is one line ``ncdlr train: ...`` naming the key or file, exit code 2, no traceback, nothing written
and no ``ray.init``; the accepted cases are checked on a Config directly, and one real run trains from a
relative ``--features`` path.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from ncdlr.cli import main
from ncdlr.data.features import read_feature_table, synthetic_features, write_feature_table
from ncdlr.data.shards import write_dataset
from ncdlr.models import build_model
from ncdlr.service.checkpoint import save_checkpoint
from ncdlr.service.config import Config, load_yaml
from ncdlr.service.preflight import preflight
from ncdlr.service.run_data import load_training_data
from tests.fixtures.tiny_images import make_tiny_dataset
from tests.fixtures.tiny_runs import TINY_DIM, TINY_KS, TINY_KU, tiny_config, write_tiny_table


@pytest.fixture
def no_ray(monkeypatch):
    """``init_ray`` fails the test: a refusal must come before Ray starts."""
    def init_ray(**kwargs):
        raise AssertionError("Ray was started")

    monkeypatch.setattr("ncdlr.service.entry.init_ray", init_ray)


@pytest.fixture
def table(tmp_path) -> str:
    return write_tiny_table(tmp_path / "features.parquet")


def refused(capsys, *argv: str) -> str:
    """Run ``ncdlr train ARGV``; assert exit code 2 and one line without a traceback; return that line."""
    assert main(["train", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert err.startswith("ncdlr train: ")
    return err


def write_checkpoint(directory: Path, *, num_novel: int = TINY_KU, buffer_width: int | None = None,
                     heads: int = 1, buffer_rows: int = 8) -> Path:
    """A ``state.pt`` of the tiny feature-table model (identity encoder, mlp head) with ``num_novel`` clusters
    (and ``heads`` heads, their buffer columns side by side)."""
    cfg = tiny_config("unused.parquet", directory)
    cfg.model.feature_dim, cfg.model.heads = TINY_DIM, heads
    model = build_model(cfg.model, TINY_KS, num_novel)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    width = num_novel * heads if buffer_width is None else buffer_width
    buffer = {"rows": torch.zeros(buffer_rows, width), "capacity": 64, "num_clusters": width}
    return save_checkpoint(directory, model=model, optimizer=optimizer, scheduler=scheduler, labeler=None,
                           buffer=buffer, step=4, epoch=1, rng=[], config=cfg.to_dict())


def checked(cfg: Config) -> Config:
    """``cfg`` after :func:`preflight` (as ``fit`` calls it: the data read, feature_dim set)."""
    data = load_training_data(cfg.data)
    cfg.model.feature_dim = data.summary.feature_dim
    preflight(cfg, data)
    return cfg


# ---------------------------------------------------------------- 1. paths absolute on the driver
def test_relative_local_paths_become_absolute_and_s3_uris_stay(tmp_path, table, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_checkpoint(tmp_path / "old" / "checkpoint")
    cfg = tiny_config("features.parquet", Path("run"))
    cfg.run.resume, cfg.run.storage_path, cfg.run.overwrite = "old/checkpoint", "ray-store", True
    cfg.model.pretrained = "s3://bucket/dino.pth"
    checked(cfg)
    assert cfg.data.features == str(tmp_path / "features.parquet")
    assert cfg.run.output == str(tmp_path / "run")
    assert cfg.run.resume == str(tmp_path / "old" / "checkpoint")
    assert cfg.run.storage_path == str(tmp_path / "ray-store")
    assert cfg.model.pretrained == "s3://bucket/dino.pth"


def test_a_relative_resume_path_that_does_not_exist_is_refused_naming_it(tmp_path, table, monkeypatch, capsys, no_ray):
    monkeypatch.chdir(tmp_path)
    err = refused(capsys, "--features", "features.parquet", "--output", "run", "--resume", "old/checkpoint")
    assert "run.resume" in err and "old/checkpoint" in err and "does not exist" in err
    assert not (tmp_path / "run").exists()


def test_a_relative_pretrained_path_that_does_not_exist_is_refused_naming_it(tmp_path, table, monkeypatch, capsys,
                                                                             no_ray):
    monkeypatch.chdir(tmp_path)
    err = refused(capsys, "--features", "features.parquet", "--output", "run", "--pretrained", "dino.pth")
    assert "model.pretrained" in err and "dino.pth" in err
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------- 2. a test split to evaluate on
def test_a_table_without_a_test_split_is_refused_when_evaluating(tmp_path, capsys, no_ray):
    x, y, s = synthetic_features(num_known=3, num_novel=3, dim=8, n_max=20, ratio=2, test_per_class=0, seed=0)
    keep = s != "test"
    path = tmp_path / "no-test.parquet"
    write_feature_table(str(path), x[keep], y[keep], s[keep], num_known=3, num_novel=3)
    err = refused(capsys, "--features", str(path), "--output", str(tmp_path / "run"))
    assert "run.evaluate" in err and "no-test.parquet" in err and "test split" in err
    assert not (tmp_path / "run").exists()
    checked(tiny_config(str(path), tmp_path / "run", run={"evaluate": False}))  # without evaluation: accepted


def test_an_image_dataset_without_a_test_split_is_refused_when_evaluating(tmp_path, capsys, no_ray):
    records, classes, info = make_tiny_dataset(test_per_class=0, size=16)
    write_dataset(str(tmp_path / "dataset"), records, classes, replace(info, name="no-test"), progress=False)
    err = refused(capsys, "--uri", str(tmp_path / "dataset"), "--encoder", "tiny_cnn",
                  "--output", str(tmp_path / "run"))
    assert "run.evaluate" in err and "dataset" in err and "test split" in err
    assert not (tmp_path / "run").exists()


def test_a_dataset_with_a_flipped_byte_in_a_shard_is_refused_naming_the_shard(tmp_path, capsys, no_ray):
    """Defect 2 of issue 17: a corrupt shard used to train without a word (or crash mid-epoch naming no shard)."""
    records, classes, info = make_tiny_dataset(size=16)
    manifest = write_dataset(str(tmp_path / "dataset"), records, classes, replace(info, name="flipped"), progress=False)
    shard = tmp_path / "dataset" / next(s.path for s in manifest.shards if s.split == "novel")
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    err = refused(capsys, "--uri", str(tmp_path / "dataset"), "--encoder", "tiny_cnn",
                  "--output", str(tmp_path / "run"))
    assert shard.name in err and "re-prepare" in err
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------- 3. model.num_novel against the data
def test_an_output_inside_rays_temporary_job_directory_is_refused(tmp_path, table, monkeypatch, capsys, no_ray):
    """``ray job submit --working-dir .`` runs the job in Ray's temporary copy of that directory: a relative
    ``--output`` would land there and vanish with the cluster (issue 17, defect 9)."""
    job_dir = tmp_path / "ray" / "session_2026-11-26_10-00-00_1" / "runtime_resources" / "working_dir_files" / "_ray_pkg_1"
    job_dir.mkdir(parents=True)
    monkeypatch.chdir(job_dir)
    err = refused(capsys, "--features", table, "--output", "runs/x")
    assert "run.output: 'runs/x' resolves to" in err and "deleted with the cluster" in err
    assert not (job_dir / "runs").exists()


def test_the_oracle_prior_with_another_ku_is_refused_before_ray(tmp_path, table, capsys, no_ray):
    err = refused(capsys, "--features", table, "--output", str(tmp_path / "run"), "--num-novel", "3",
                  "--labeler.prior", "fixed")
    assert "labeler.prior=fixed" in err and "got 3" in err


@pytest.mark.parametrize("storage,shared,nodes,ok", [("", False, 1, True), ("", False, 2, False), ("", True, 2, True),
                                                     ("s3://bucket/runs", False, 3, True),
                                                     ("/mnt/nfs/runs", False, 2, False)])
def test_local_checkpoint_storage_on_a_multi_node_cluster_needs_shared_storage(tmp_path, storage, shared, nodes, ok):
    """Issue 17, defect 10 (the rule; the simulated two-node run in test_trainer_e2e meets it through ``fit``)."""
    from ncdlr.service.config import ConfigError
    from ncdlr.service.preflight import check_cluster_storage

    cfg = Config()
    cfg.run.output, cfg.run.storage_path, cfg.run.shared_storage = str(tmp_path / "run"), storage, shared
    if ok:
        check_cluster_storage(cfg, nodes)
    else:
        with pytest.raises(ConfigError, match=f"this Ray cluster has {nodes} nodes"):
            check_cluster_storage(cfg, nodes)


def test_one_novel_cluster_is_refused(tmp_path, table, capsys, no_ray):
    err = refused(capsys, "--features", table, "--output", str(tmp_path / "run"), "--num-novel", "1")
    assert "model.num_novel=1" in err and "at least 2" in err
    assert not (tmp_path / "run").exists()


def test_more_novel_clusters_than_novel_rows_is_refused_naming_both_numbers(tmp_path, table, capsys, no_ray):
    rows = read_feature_table(table).features["novel"].shape[0]
    err = refused(capsys, "--features", table, "--output", str(tmp_path / "run"), "--num-novel", str(rows + 1))
    assert f"model.num_novel={rows + 1}" in err and f"{rows} novel training rows" in err and table in err
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------- 4. run.resume readable and compatible
def test_an_unreadable_resume_checkpoint_is_refused_naming_the_file(tmp_path, table, capsys, no_ray):
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "state.pt").write_bytes(b"not a checkpoint")
    err = refused(capsys, "--features", table, "--output", str(tmp_path / "run"), "--resume", str(tmp_path / "old"))
    assert "state.pt" in err and "cannot be read" in err
    assert not (tmp_path / "run").exists()


def test_a_resume_checkpoint_of_another_model_is_refused_naming_the_parameter(tmp_path, table, capsys, no_ray):
    write_checkpoint(tmp_path / "old", num_novel=TINY_KU)
    err = refused(capsys, "--features", table, "--output", str(tmp_path / "run"), "--resume", str(tmp_path / "old"),
                  "--num-novel", str(TINY_KU + 2))
    assert "run.resume" in err and "state.pt" in err and "shape" in err
    assert not (tmp_path / "run").exists()


def test_a_resume_checkpoint_whose_buffer_has_another_ku_is_refused(tmp_path, table, capsys, no_ray):
    write_checkpoint(tmp_path / "old", buffer_width=TINY_KU - 1)
    err = refused(capsys, "--features", table, "--output", str(tmp_path / "run"), "--resume", str(tmp_path / "old"))
    assert "run.resume" in err and f"{TINY_KU - 1} novel clusters" in err and f"Ku = {TINY_KU}" in err
    assert not (tmp_path / "run").exists()


def test_a_resume_checkpoint_with_more_buffer_rows_than_the_capped_buffer_is_refused_naming_the_cap(
        tmp_path, table, capsys, no_ray):
    """``labeler.buffer_epochs`` shortens the buffer before the resume check reads it: a checkpoint of 40 rows
    (written with a longer buffer) against one step of 2 × 8 rows is refused, the message naming the cap and how to
    keep ``buffer_size`` as given; with the cap off the same checkpoint is accepted."""
    write_checkpoint(tmp_path / "old", buffer_rows=40)
    argv = ("--features", table, "--output", str(tmp_path / "run"), "--resume", str(tmp_path / "old"),
            "--data.batch_size", "8", "--labeler.buffer_size", "64")
    err = refused(capsys, *argv, "--labeler.buffer_epochs", "0.01")
    assert "its buffer holds 40 rows" in err and "labeler.buffer_size = 16" in err
    assert "labeler.buffer_epochs 0.01" in err and "--labeler.buffer_epochs 0" in err
    assert not (tmp_path / "run").exists()
    cfg = tiny_config(table, tmp_path / "run", run={"resume": str(tmp_path / "old")},
                      labeler={"buffer_size": 64, "buffer_epochs": 0.0})
    assert checked(cfg).labeler.buffer_size == 64


def test_a_resume_checkpoint_of_another_head_count_is_refused_and_its_own_is_accepted(tmp_path, table, capsys, no_ray):
    """``model.heads``: the checkpoint's extra heads and its ``H·Ku``-wide buffer must match the run's."""
    write_checkpoint(tmp_path / "old", heads=2)
    err = refused(capsys, "--features", table, "--output", str(tmp_path / "run"), "--resume", str(tmp_path / "old"))
    assert "run.resume" in err and "state.pt" in err and "extra_heads" in err
    checked(tiny_config(table, tmp_path / "run", run={"resume": str(tmp_path / "old")}, model={"heads": 2}))
    write_checkpoint(tmp_path / "wide", heads=2, buffer_width=TINY_KU)
    err = refused(capsys, "--features", table, "--output", str(tmp_path / "run"), "--resume", str(tmp_path / "wide"),
                  "--model.heads", "2")
    assert f"{TINY_KU} novel clusters" in err and f"Ku = {TINY_KU} (model.num_novel) × 2 heads" in err
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------- 5. a run directory is never overwritten silently
@pytest.mark.parametrize("marker", ["config.yaml", "metrics.json"])
def test_a_run_directory_holding_a_run_is_refused(tmp_path, table, capsys, no_ray, marker):
    run = tmp_path / "run"
    run.mkdir()
    (run / marker).write_text("earlier run\n")
    err = refused(capsys, "--features", table, "--output", str(run))
    assert "run.output" in err and str(run) in err and marker in err and "--overwrite" in err
    assert [p.name for p in run.iterdir()] == [marker] and (run / marker).read_text() == "earlier run\n"


def test_an_occupied_run_directory_is_accepted_with_overwrite_or_resume(tmp_path, table):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.json").write_text(json.dumps({"all": 0.5}))
    checked(tiny_config(table, run, run={"overwrite": True}))
    write_checkpoint(run / "checkpoint")
    checked(tiny_config(table, run, run={"resume": str(run / "checkpoint")}))


# ---------------------------------------------------------------- the real thing
@pytest.mark.slow
def test_relative_features_and_resume_paths_reach_the_ray_workers(tmp_path, table, monkeypatch, ray_local):
    """A run from relative paths, then one resuming from a relative checkpoint path: the workers (in Ray's own
    directory) read the checkpoint, and the saved config names absolute paths."""
    monkeypatch.chdir(tmp_path)
    common = ["--features", "features.parquet", "--batch-size", "16", "--buffer-size", "64", "--warmup-epochs", "0.5",
              "--num-workers", "1", "--use-gpu", "false"]
    assert main(["train", *common, "--epochs", "1", "--evaluate", "false", "--output", "first"]) == 0
    checkpoint = os.path.relpath((tmp_path / "first" / "checkpoint.txt").read_text().strip(), tmp_path)
    assert main(["train", *common, "--epochs", "2", "--resume", checkpoint, "--output", "second"]) == 0
    metrics = json.loads((tmp_path / "second" / "metrics.json").read_text())
    assert 0.0 <= metrics["novel"] <= 1.0 and np.isfinite(metrics["all"])
    saved = load_yaml(tmp_path / "second" / "config.yaml")
    assert saved.data.features == str(tmp_path / "features.parquet")
    assert saved.run.resume == str(tmp_path / checkpoint) and saved.run.output == str(tmp_path / "second")


def test_an_imprinted_head_in_image_mode_is_refused_before_ray(tmp_path, capsys, no_ray):
    """``model.head_init imprint`` fits the head on rows in memory: image shards streamed by Ray Data are refused."""
    records, classes, info = make_tiny_dataset(size=16)
    write_dataset(str(tmp_path / "dataset"), records, classes, info, progress=False)
    err = refused(capsys, "--uri", str(tmp_path / "dataset"), "--encoder", "tiny_cnn", "--model.head", "linear",
                  "--model.head_init", "imprint", "--output", str(tmp_path / "run"))
    assert "model.head_init imprint" in err and "--features" in err
    assert not (tmp_path / "run").exists()
