"""``labeler.buffer_epochs``: the shared buffer bounded in epochs of the novel pool, resolved once its size is known.

The paper's ``J = 2048`` rows are a small part of an epoch on its iNat subsets; on a pool of 1,422 images with a
batch of 128 they are 0.73 of one, and the sizes the transport holds over buffer + batch rows then let older rows
take the rare clusters while the rows that train crowd into a few (results.md, sessions 52 and 64). With
``labeler.buffer_epochs = f > 0`` the trainer shortens ``labeler.buffer_size`` to ``⌊f · steps⌋`` whole steps of
rows (:func:`ncdlr.buffer.epoch_capped_rows`) before the buffer is built; the run's ``config.yaml`` keeps the result.
Off by default (0): on the bare cache command a fifth of an epoch won 6.1 novel points on Emoji-LT p0 and lost 4.1
on OpenClipart-LT p0, half an epoch 2.0 (SE 1.4) on Emoji-LT for 6.4 known points (session 64).
"""

from __future__ import annotations

import logging

from ncdlr.buffer import epoch_capped_rows

from .config import Config
from .train_loop import steps_per_epoch

log = logging.getLogger(__name__)

#: rows a step appends per novel image: the logits of its two views (``ncdlr.methods.discovery``)
VIEWS_PER_IMAGE = 2


def step_rows(cfg: Config, world: int) -> int:
    """Rows a global step appends to the buffer: the two views of ``world × data.batch_size`` novel images."""
    return VIEWS_PER_IMAGE * max(1, world) * cfg.data.batch_size


def buffer_share_of_epoch(cfg: Config, steps: int, world: int) -> float:
    """How much of an epoch of the pool ``labeler.buffer_size`` rows are (``steps`` global steps of
    :func:`step_rows` each): 2048 rows of 11 steps of 256 are 0.73."""
    return cfg.labeler.buffer_size / (steps * step_rows(cfg, world))


def fill_buffer_cap(cfg: Config, novel_rows: int, *, world: int, max_steps: int = 0) -> int | None:
    """Shorten ``cfg.labeler.buffer_size`` in place to ``labeler.buffer_epochs`` of the pool; the new ``J`` or None.

    Args:
        novel_rows: images in the novel training split (the pool).
        world: training workers ``W``; a step appends ``2 · W · data.batch_size`` rows.
        max_steps: ``data.max_steps_per_epoch`` where it applies (feature tables), else 0.

    Returns:
        The shortened ``J`` (a line says so), or None when the cap is off, the run uses no buffer, the pool holds
        less than one global batch (the trainer refuses that itself) or ``J`` is already within the cap.
    """
    labeler = cfg.labeler
    if labeler.buffer_epochs <= 0 or not labeler.use_buffer:
        return None
    try:
        steps = steps_per_epoch(novel_rows, cfg.data.batch_size, world, max_steps)
    except ValueError:
        return None
    rows = step_rows(cfg, world)
    capped = epoch_capped_rows(labeler.buffer_size, steps, rows, labeler.buffer_epochs)
    if capped >= labeler.buffer_size:
        return None
    log.info("labeler.buffer_size %d -> %d rows: labeler.buffer_epochs %g of the novel pool's %d steps of %d rows "
             "(older rows loosen the held cluster sizes on the rows that train)", labeler.buffer_size, capped,
             labeler.buffer_epochs, steps, rows)
    labeler.buffer_size = capped
    return capped
