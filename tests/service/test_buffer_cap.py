"""``labeler.buffer_epochs``: the shared buffer bounded in epochs of the novel pool (results.md, session 64)."""

from __future__ import annotations

import pytest

from ncdlr.buffer import epoch_capped_rows
from ncdlr.service.buffer_cap import fill_buffer_cap
from ncdlr.service.config import Config, ConfigError, load_config


@pytest.mark.parametrize(("steps", "expected"), [(11, 512), (16, 768), (15, 768), (3, 256), (50, 2048)])
def test_the_cap_is_whole_steps_of_a_fifth_of_an_epoch(steps, expected):
    """A batch of 128 novel images appends 256 rows a step: Emoji-LT p0's 11 steps give 2 steps of history (512 rows),
    OpenClipart-LT p0's 16 give 3 (768; 0.2 · 15 is 3 too, not 2 by a rounding error), a 3-step pool keeps one step,
    and a pool of 50 steps stays at the configured 2048."""
    assert epoch_capped_rows(2048, steps, 256, 0.2) == expected


def test_no_cap_and_a_shorter_buffer_are_left_alone_and_bad_arguments_refused():
    assert epoch_capped_rows(2048, 11, 256, 0.0) == 2048  # 0 = off
    assert epoch_capped_rows(300, 11, 256, 0.5) == 300  # 5 steps = 1280 rows allowed: J is under it
    with pytest.raises(ValueError, match="max_epochs"):
        epoch_capped_rows(2048, 11, 256, -0.1)
    with pytest.raises(ValueError, match="steps_per_epoch"):
        epoch_capped_rows(2048, 0, 256, 0.2)


def _cfg(**labeler) -> Config:
    cfg = Config()
    cfg.data.batch_size = 128
    for key, value in labeler.items():
        setattr(cfg.labeler, key, value)
    return cfg


def test_fill_shortens_the_buffer_from_the_pools_size_and_workers():
    """The pool of Emoji-LT p0 (1,422 novel images, batch 128): one worker → 2 steps of 256 rows; two workers take
    the pool in 5 global steps of 512 rows, so one step (512 rows) remains."""
    cfg = _cfg(buffer_epochs=0.2)
    assert fill_buffer_cap(cfg, 1422, world=1) == 512 and cfg.labeler.buffer_size == 512
    cfg = _cfg(buffer_epochs=0.2)
    assert fill_buffer_cap(cfg, 1422, world=2) == 512 and cfg.labeler.buffer_size == 512
    cfg = _cfg(buffer_epochs=0.2)  # data.max_steps_per_epoch shortens the epoch, and the cap with it
    assert fill_buffer_cap(cfg, 100_000, world=1, max_steps=10) == 512


def test_fill_leaves_a_run_alone_when_the_cap_is_off_unused_or_already_met():
    cfg = _cfg(buffer_epochs=0.0)
    assert fill_buffer_cap(cfg, 1422, world=1) is None and cfg.labeler.buffer_size == 2048
    cfg = _cfg(buffer_epochs=0.2, use_buffer=False)  # UNO and the no-buffer ablation solve on the batch alone
    assert fill_buffer_cap(cfg, 1422, world=1) is None and cfg.labeler.buffer_size == 2048
    cfg = _cfg(buffer_epochs=0.2, buffer_size=512)  # a config's J already within a fifth of the pool
    assert fill_buffer_cap(cfg, 1422, world=1) is None and cfg.labeler.buffer_size == 512
    cfg = _cfg(buffer_epochs=0.2)  # fewer rows than one global batch: the trainer refuses that itself, later
    assert fill_buffer_cap(cfg, 100, world=1) is None and cfg.labeler.buffer_size == 2048


def test_the_key_is_read_and_checked_from_the_command_line():
    assert load_config(None, ["--labeler.buffer_epochs", "0.5"]).labeler.buffer_epochs == 0.5
    with pytest.raises(ConfigError, match="labeler.buffer_epochs"):
        load_config(None, ["--labeler.buffer_epochs", "-1"])


def test_an_in_process_training_builds_its_buffer_at_the_capped_size(tmp_path):
    """``ncdlr.service.local.train`` (the rehearsals' and the quality benchmark's trainer) applies the cap before it
    builds the buffer: a pool of 5 novel classes with batch 16 and a cap of one step → a 32-row buffer, not 64."""
    from ncdlr.data.features import read_feature_table
    from ncdlr.service.local import train
    from tests.fixtures.tiny_runs import tiny_config, write_tiny_table

    table = write_tiny_table(tmp_path / "f.parquet")
    splits = read_feature_table(table)
    novel = splits.features["novel"].shape[0]
    cfg = tiny_config(table, tmp_path, labeler={"buffer_epochs": 1e-6})
    cfg.optim.epochs = 1
    run = train(cfg, splits)
    assert novel >= 2 * 16  # at least two steps, so the cap bites below the configured 64 rows
    assert cfg.labeler.buffer_size == 32
    assert run.method.discovery.buffer.buffer.capacity == 32
