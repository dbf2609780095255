"""Ray Train run storage on ``s3://`` against the real rclone S3 server (``ncdlr.data.storage.run_storage_filesystem``).

Ray Train and ``pyarrow.fs.copy_files`` create a zero-byte marker object for every level of a nested directory;
``rclone serve s3`` refuses a marker whose parent folder exists ("Internal Error"). Our filesystem writes no
markers (S3 prefixes are implicit). The first test pins the server behaviour that makes this necessary.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

import pyarrow.fs as pafs
import pytest

from ncdlr.data.storage import BucketNotFoundError, run_storage_filesystem, s3_filesystem


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
