"""Ray Train run storage on ``s3://`` against the real rclone S3 server (``ncdlr.data.storage.run_storage_filesystem``).

Ray Train and ``pyarrow.fs.copy_files`` create a zero-byte marker object for every level of a nested directory;
``rclone serve s3`` refuses a marker whose parent folder exists ("Internal Error"). Our filesystem writes no
markers (S3 prefixes are implicit). The first test pins the server behaviour that makes this necessary.
Deleting is the same story: pyarrow re-creates the parent's marker once a prefix's last object is gone, which
broke Ray Train's checkpoint rotation there; our filesystem deletes the objects under a prefix and creates nothing.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys

import pyarrow.fs as pafs
import pytest

from ncdlr.data.storage import BucketNotFoundError, boto3_client, run_storage_filesystem, s3_filesystem


def test_rclone_refuses_the_nested_directory_markers_plain_pyarrow_writes(s3_bucket):
    bucket = s3_bucket.removeprefix("s3://")
    with pytest.raises(OSError, match="Internal Error"):
        s3_filesystem().create_dir(f"{bucket}/x/y")


def test_nested_dirs_and_copy_files_work_without_markers(s3_bucket, tmp_path):
    fs, path = run_storage_filesystem(f"{s3_bucket}/runs")
    fs.create_dir(f"{path}/exp/checkpoint_0/nested")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "state.pt").write_bytes(b"weights")
    (tmp_path / "meta.json").write_text("{}")
    pafs.copy_files(str(tmp_path), f"{path}/exp/checkpoint_0", destination_filesystem=fs)
    assert fs.get_file_info(f"{path}/exp/checkpoint_0/sub").type == pafs.FileType.Directory
    with fs.open_input_stream(f"{path}/exp/checkpoint_0/sub/state.pt") as f:
        assert f.read() == b"weights"


def test_a_missing_bucket_is_named(s3_bucket):
    with pytest.raises(BucketNotFoundError, match="s3://no-such-bucket-x"):
        run_storage_filesystem("s3://no-such-bucket-x/runs")


def test_unpickled_in_a_process_without_the_checksum_settings_it_still_uploads(s3_bucket):
    """What a Ray Train controller or worker does: unpickle the filesystem, then upload a nested file."""
    fs, path = run_storage_filesystem(f"{s3_bucket}/runs")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}  # no endpoint, keys or checksums
    code = ("import pickle, sys; fs = pickle.loads(sys.stdin.buffer.read()); "
            f"fs.create_dir('{path}/a/b'); s = fs.open_output_stream('{path}/a/b/c.txt'); s.write(b'ok'); s.close()")
    proc = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(fs), env=env, capture_output=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    with fs.open_input_stream(f"{path}/a/b/c.txt") as f:
        assert f.read() == b"ok"


def _object_keys(s3_bucket: str) -> list[str]:
    listing = boto3_client().list_objects_v2(Bucket=s3_bucket.removeprefix("s3://"))
    return sorted(obj["Key"] for obj in listing.get("Contents", []))


def test_rclone_refuses_what_plain_pyarrow_does_to_delete_a_nested_directory(s3_bucket):
    fs, path = run_storage_filesystem(f"{s3_bucket}/runs")
    with fs.open_output_stream(f"{path}/old/sub/m.json") as f:
        f.write(b"{}")
    with pytest.raises(OSError, match="old/sub/"):
        s3_filesystem().delete_dir(f"{path}/old")


def test_deleting_an_old_checkpoint_leaves_the_latest_readable_and_creates_no_marker(s3_bucket, s3_server):
    """What Ray Train's checkpoint rotation does (``delete_dir`` of the oldest ``checkpoint_*``)."""
    fs, path = run_storage_filesystem(f"{s3_bucket}/runs")
    fs = pickle.loads(pickle.dumps(fs))  # as Ray's controller holds it
    log_start = len(s3_server.log_tail(1 << 30))
    for name in ("checkpoint_0", "checkpoint_1"):
        for leaf in ("state.pt", "sub/meta.json"):
            with fs.open_output_stream(f"{path}/exp/{name}/{leaf}") as f:
                f.write(name.encode())
    fs.delete_dir(f"{path}/exp/checkpoint_0")
    with fs.open_input_stream(f"{path}/exp/checkpoint_1/state.pt") as f:
        assert f.read() == b"checkpoint_1"
    assert fs.get_file_info(f"{path}/exp/checkpoint_0").type == pafs.FileType.NotFound
    assert _object_keys(s3_bucket) == ["runs/exp/checkpoint_1/state.pt", "runs/exp/checkpoint_1/sub/meta.json"]
    fs.delete_file(f"{path}/exp/checkpoint_1/sub/meta.json")  # the prefix's last object: no marker replaces it
    assert fs.get_file_info(f"{path}/exp/checkpoint_1/sub").type == pafs.FileType.NotFound
    fs.delete_dir_contents(f"{path}/exp")
    assert _object_keys(s3_bucket) == []
    fs.delete_dir_contents(f"{path}/exp", missing_dir_ok=True)
    with pytest.raises(FileNotFoundError, match="exp"):
        fs.delete_dir_contents(f"{path}/exp")
    refused = s3_server.log_tail(1 << 30)[log_start:]  # rclone logs each refused marker write or delete
    assert "already exists" not in refused and "unsupported characters" not in refused, refused


@pytest.mark.slow
def test_a_run_rotating_checkpoints_on_s3_keeps_the_latest_and_evaluates(ray_local, s3_bucket, tmp_path):
    """``--epochs 3 --checkpoints-to-keep 1`` on ``s3://``: two rotations, then the final evaluation reads the
    last checkpoint at once (before the fix: ``FileNotFoundError`` on its ``state.pt``)."""
    from ncdlr.cli import main
    from ncdlr.data.features import synthetic_features, write_feature_table
    from ncdlr.service.checkpoint import load_checkpoint

    x, y, s = synthetic_features(num_known=5, num_novel=5, dim=16, n_max=40, ratio=4, test_per_class=6, seed=3)
    table = str(tmp_path / "features.parquet")
    write_feature_table(table, x, y, s, num_known=5, num_novel=5)
    assert main(["train", "--features", table, "--num-workers", "1", "--batch-size", "8", "--gamma", "5",
                 "--buffer-size", "64", "--warmup-epochs", "1", "--storage-path", f"{s3_bucket}/runs",
                 "--epochs", "3", "--checkpoints-to-keep", "1", "--output", str(tmp_path / "run")]) == 0
    latest = (tmp_path / "run" / "checkpoint.txt").read_text().strip()
    assert load_checkpoint(latest)["epoch"] == 3
    keys = _object_keys(s3_bucket)
    assert not [k for k in keys if k.endswith("/")], keys
    assert len({k.split("/")[2] for k in keys if k.count("/") > 2}) == 1, keys  # one checkpoint_* folder
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert 0.0 <= metrics["novel"] <= 1.0
