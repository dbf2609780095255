"""Names of a run's classes: known classes by their dataset name, novel clusters ``novel-NN`` unless named.

A novel cluster ``j`` (class index ``Ks + j``) is keyed ``novel-{j:02d}``; its dataset-side true class is never
used as its name (clusters are not aligned with labels). People name clusters after looking at the gallery:
``ncdlr name RUN --set novel-07="barn owl"`` writes ``RUN/names.yaml``, a mapping ``novel-07: barn owl``, which
``ncdlr predict`` and ``ncdlr gallery`` read. Known classes keep their names (a key that is not a novel cluster
of this run is refused).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import yaml

NAMES_FILE = "names.yaml"
PREVIOUS_NAMES_FILE = "names.previous.yaml"  #: where a retrained run's old names go (kept, not applied)
_KEY = re.compile(r"^novel-(\d+)$")


class NamesError(ValueError):
    """A name or names file that cannot be used (names the key or the file)."""


def novel_key(j: int) -> str:
    """The key of novel cluster ``j`` (0-based within the novel clusters): ``novel-07``."""
    return f"novel-{j:02d}"


def parse_key(key: str, num_novel: int) -> int:
    """Cluster ``j`` of the key ``novel-NN``; refuses other keys and ``j`` outside ``0..Ku-1``."""
    match = _KEY.match(key.strip())
    if not match:
        raise NamesError(f"{key!r} is not a novel cluster's key (novel-00 .. {novel_key(num_novel - 1)}); "
                         "known classes keep their dataset names")
    j = int(match.group(1))
    if not 0 <= j < num_novel:
        raise NamesError(f"{key!r}: this run has {num_novel} novel clusters (novel-00 .. {novel_key(num_novel - 1)})")
    return j


def read_names(run_dir: str | Path, num_novel: int) -> dict[int, str]:
    """``{j: name}`` from ``run_dir/names.yaml`` (empty when the file is absent); every key checked."""
    path = Path(run_dir) / NAMES_FILE
    if not path.is_file():
        return {}
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise NamesError(f"{path}: not valid YAML ({err})") from err
    if not isinstance(raw, dict):
        raise NamesError(f"{path}: must map novel-NN keys to names, got a {type(raw).__name__}")
    names = {}
    for key, name in raw.items():
        j = parse_key(str(key), num_novel)
        if not isinstance(name, str) or not name.strip():
            raise NamesError(f"{path}: the name of {key} must be a non-empty string, got {name!r}")
        names[j] = name.strip()
    return names


def update_names(run_dir: str | Path, num_novel: int, assign: Mapping[str, str] = {},
                 remove: Sequence[str] = ()) -> dict[int, str]:
    """Set the names in ``assign`` (``{"novel-07": "barn owl"}``) and drop the keys in ``remove``; rewrite
    ``names.yaml`` atomically. Returns the names now in force. Nothing is written when a key is refused."""
    names = read_names(run_dir, num_novel)
    for key, name in assign.items():
        j = parse_key(key, num_novel)
        if not name.strip():
            raise NamesError(f"the name of {key} is empty (use --unset {key} to go back to the default)")
        names[j] = name.strip()
    for key in remove:
        names.pop(parse_key(key, num_novel), None)
    path = Path(run_dir) / NAMES_FILE
    tmp = path.with_name(f".{NAMES_FILE}.tmp")
    tmp.write_text(yaml.safe_dump({novel_key(j): names[j] for j in sorted(names)}, allow_unicode=True, sort_keys=False))
    os.replace(tmp, path)
    return names


def display_names(class_names: Sequence[str], num_known: int, num_novel: int, named: Mapping[int, str]) -> list[str]:
    """``[Ks + Ku]`` names by class index: the dataset's name for known classes, ``named[j]`` or ``novel-NN``
    for novel cluster ``j``."""
    return [str(n) for n in class_names[:num_known]] + [named.get(j, novel_key(j)) for j in range(num_novel)]


def class_keys(class_names: Sequence[str], num_known: int, num_novel: int) -> list[str]:
    """``[Ks + Ku]`` stable keys: the known class's dataset name, ``novel-NN`` for novel clusters."""
    return display_names(class_names, num_known, num_novel, {})


def set_aside_names(run_dir: str | Path) -> Path | None:
    """Move ``names.yaml`` to ``names.previous.yaml`` (a run directory being trained again: the new clusters are
    not the old ones, so the old names must not apply to them, but they are not deleted). Returns the new path."""
    path = Path(run_dir) / NAMES_FILE
    if not path.is_file():
        return None
    target = path.with_name(PREVIOUS_NAMES_FILE)
    os.replace(path, target)
    return target
