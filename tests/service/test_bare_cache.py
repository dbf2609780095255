"""The bare activation-cache command's labeler (:mod:`ncdlr.service.bare_cache`): which tables and methods get it,
and that the command line and a config file still win. Real parquet tables written by the project's own writer."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from ncdlr.service.bare_cache import BARE_CACHE_LABELER, SOURCE, bare_cache_settings
from ncdlr.service.config import resolve
from tests.fixtures.tiny_runs import write_tiny_table


def _cache(folder, known_labels=(0, 1, 0, 1, 1)):
    """A ``[3 views, 32, 8, 8]`` activation cache of 2 known and 2 novel classes (known counts from ``known_labels``)."""
    from tests.fixtures.activation_caches import write_activation_cache

    parts = {"known": (3, list(known_labels)), "novel": (3, [2, 3, 3, 2]), "test": (1, [0, 1, 2, 3])}
    return write_activation_cache(folder, parts, num_known=2, seed=0)


def _train_config(argv):
    from ncdlr.commands import train as train_command
    from ncdlr.cli import build_parser

    return train_command.build_config(build_parser().parse_args(["train", *argv]))


def test_a_bare_cache_trains_ncdlr_with_relaxed_sizes_on_a_short_buffer(tmp_path, caplog):
    cache = _cache(tmp_path / "cache")
    with caplog.at_level(logging.INFO, logger="ncdlr.service.bare_cache"):
        cfg = _train_config(["--features", cache])
    got = {key: getattr(getattr(cfg, key.split(".")[0]), key.split(".")[1]) for key in BARE_CACHE_LABELER}
    assert got == BARE_CACHE_LABELER
    assert cfg.model.head == "mlp" and cfg.method.name == "ncdlr"
    assert "a bare activation cache: ncdlr labels the novel rows with labeler.prior uniform" in caplog.text


def test_the_command_line_wins_and_a_config_file_or_another_method_gets_none_of_it(tmp_path):
    cache = _cache(tmp_path / "cache")
    cfg = _train_config(["--features", cache, "--labeler.reg_m", "0", "--labeler.buffer_epochs", "0"])
    assert (cfg.labeler.reg_m, cfg.labeler.buffer_epochs, cfg.labeler.prior) == (0.0, 0.0, "uniform")
    uno = _train_config(["--features", cache, "--method.name", "uno"])
    default = resolve([])
    assert (uno.labeler.reg_m, uno.labeler.relax_bound, uno.labeler.buffer_epochs) == (
        default.labeler.reg_m, default.labeler.relax_bound, default.labeler.buffer_epochs)
    fashion = _train_config(["--features", cache, "--config", "configs/fashion_mnist.yaml"])
    assert fashion.labeler.buffer_epochs == 0.0 and fashion.labeler.buffer_size == 512


def test_head_only_tables_and_balanced_known_classes_keep_the_papers_labeler(tmp_path, caplog):
    """A head-only table has no cached blocks; a cache whose known classes have one count gives the guard no bound."""
    assert bare_cache_settings(write_tiny_table(tmp_path / "t.parquet")) == []
    balanced = _cache(tmp_path / "balanced", known_labels=(0, 1, 0, 1))
    with caplog.at_level(logging.INFO, logger="ncdlr.service.bare_cache"):
        assert bare_cache_settings(balanced) == []
    assert "known classes have one training count: ncdlr keeps the paper's labeler" in caplog.text
    cfg = _train_config(["--features", balanced])
    assert (cfg.labeler.reg_m, cfg.labeler.buffer_epochs) == (0.0, 0.0)


def test_a_missing_table_adds_nothing_and_a_malformed_one_is_refused_by_name(tmp_path):
    """A table that is not there is left to the run's own read (it refuses it by name); one that is not a feature
    table is refused here with the reader's message."""
    from ncdlr.data.features import FeatureTableError

    assert bare_cache_settings(str(tmp_path / "nowhere")) == []
    (tmp_path / "bad.parquet").write_bytes(b"not parquet")
    with pytest.raises(FeatureTableError, match="not a parquet file"):
        bare_cache_settings(str(tmp_path / "bad.parquet"))


def test_the_settings_name_their_source_so_errors_point_at_it(tmp_path):
    settings = bare_cache_settings(_cache(tmp_path / "cache"))
    assert [s.key for s in settings] == list(BARE_CACHE_LABELER) and {s.source for s in settings} == {SOURCE}
    assert not any(s.from_text for s in settings) and np.isclose(settings[1].value, 0.45)
