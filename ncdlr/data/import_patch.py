"""Patch a module of a library when it is first imported (or now, if it is already loaded).

Ray's worker processes import Ray's own modules lazily; a ``worker_process_setup_hook`` that patched them by
importing them would make every worker load them. :func:`patch_when_imported` instead adds a finder to
``sys.meta_path`` that finds nothing itself but, for the one module named, wraps its loader so that ``patch(module)``
runs right after the module's own code. Used by :mod:`ncdlr.data.idle_wait` (Ray Data's executor) and
:mod:`ncdlr.service.worker_setup` (Ray Train's placement-group cleaner).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself; wraps the loader of ``name`` so ``patch`` runs on the module once it is loaded."""

    def __init__(self, name: str, patch: Callable[[ModuleType], Any]):
        self.name, self.patch = name, patch

    def find_spec(self, name, path, target=None):
        if name != self.name:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is None or spec.loader is None:
            return None
        load, patch = spec.loader.exec_module, self.patch

        def exec_module(module):
            load(module)
            patch(module)

        spec.loader.exec_module = exec_module
        return spec


def patch_when_imported(name: str, patch: Callable[[ModuleType], Any]) -> Any:
    """Run ``patch(module)`` on the module called ``name``: now if it is loaded (returns what ``patch`` returns),
    else right after its first import (returns None). A second call for the same ``name`` while the first waits
    adds nothing: ``patch`` must itself be safe to run on a module it already patched."""
    if name in sys.modules:
        return patch(sys.modules[name])
    if not any(isinstance(finder, _PatchOnImport) and finder.name == name for finder in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport(name, patch))
    return None
