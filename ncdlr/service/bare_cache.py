"""The labeler of the bare activation-cache command: ``ncdlr train --features CACHE`` without a config file.

A config file says its own labeler; image mode and head-only tables keep the paper's (sizes held at the learned
prior's, ``J = 2048`` rows of buffer). On an activation cache (``ncdlr embed --trainable-blocks B``) without a config,
ncdlr's self-labeling is the one the dataset configs use — the paper's relaxed transport solved exactly, its cluster
sizes pulled towards uniform (``labeler.prior uniform``, ``labeler.reg_m 0.45``) and held again once an epoch's
pseudo-labels run past the known classes' imbalance (``labeler.relax_bound known``) — over a buffer of at most a fifth
of an epoch of the novel pool (``labeler.buffer_epochs 0.2``). Measured at the bare command's budget (50 epochs, batch
128 a half, ``mlp`` head; results.md, sessions 62–68), three seeds a set on six real sets, against the paper's labeler
(sizes held, J 2048) and UNO's bare command: +1.31 novel points (SE 1.10) over the paper's labeler pooled (four sets
up, two down), ahead of UNO on all six (+1.57, SE 0.92, over the five icon sets), where the paper's labeler led UNO on
three. Chosen by a rule registered before the sixth set (MDI-LT) was run. Re-read at five seeds (sessions 69–71),
the lead is gone on Phosphor-LT and Emoji-LT — level with UNO (+0.19, SE 1.94; +0.30, SE 1.41) — and on
OpenClipart-LT it is smaller (+1.25, SE 0.39); ahead on known classes on all three (+1.7 to +1.8), behind on the novel
tail on all three.

``--labeler.*`` flags and a ``--config`` file override it; ``--method.name uno`` (or any other method) never gets it.
The guard needs the known classes' imbalance, so a cache whose known classes all have one training count keeps the
paper's labeler (a line says so).
"""

from __future__ import annotations

import logging
from typing import Sequence

from .config import Setting

log = logging.getLogger(__name__)

#: ncdlr's labeler on a bare activation cache (``section.key`` → value)
BARE_CACHE_LABELER: dict[str, object] = {"labeler.prior": "uniform", "labeler.reg_m": 0.45,
                                          "labeler.relax_bound": "known", "labeler.buffer_epochs": 0.2}
#: where these settings come from, as errors and the resolved config's reader see it
SOURCE = "the bare activation-cache command (ncdlr.service.bare_cache)"


def _given(overrides: Sequence[Setting], key: str, default: object) -> object:
    """The last value of ``key`` among the command line's ``overrides`` (``section.key`` settings), else ``default``."""
    values = [s.value for s in overrides if s.key == key]
    return values[-1] if values else default


def bare_cache_settings(uri: str, overrides: Sequence[Setting] = ()) -> list[Setting]:
    """The settings :data:`BARE_CACHE_LABELER` adds for ``ncdlr train --features uri`` without a config file, before
    the command line's ``overrides`` (which still win): none unless the table is an activation cache, the method is
    ncdlr and its known classes' training counts differ (the guard's bound). Reads the table's schema and its label
    and split columns (``data.endpoint_url`` from ``overrides``). A table that is not there gets none (the run's
    own read refuses it by name); a malformed one raises what the run would."""
    from ncdlr.data.features import ACTIVATIONS, read_class_summary, read_metadata
    from ncdlr.data.storage import ObjectNotFoundError

    if _given(overrides, "method.name", "ncdlr") != "ncdlr":
        return []
    endpoint = str(_given(overrides, "data.endpoint_url", "")) or None
    try:
        kind = read_metadata(uri, endpoint_url=endpoint).get("kind")
    except ObjectNotFoundError:
        return []
    if kind != ACTIVATIONS:
        return []
    num_known, _, _, counts = read_class_summary(uri, endpoint_url=endpoint)
    known = [c for c in counts[:num_known] if c > 0]
    if len(known) < 2 or max(known) == min(known):
        log.info("a bare activation cache whose known classes have one training count: ncdlr keeps the paper's "
                 "labeler (the relaxed sizes' guard needs the known classes' imbalance)")
        return []
    log.info("a bare activation cache: ncdlr labels the novel rows with %s (results.md, sessions 62-68); "
             "--labeler.* flags or a --config file override it",
             ", ".join(f"{key} {value}" for key, value in BARE_CACHE_LABELER.items()))
    return [Setting(key, value, source=SOURCE) for key, value in BARE_CACHE_LABELER.items()]
