"""``evaluate_run`` without Ray: a checkpoint of the plain loop on a feature table, evaluated into a report."""

from __future__ import annotations

import json

import pytest
import torch

from ncdlr.models import build_model
from ncdlr.service.checkpoint import rng_state, save_state
from ncdlr.service.config import Config, save_config
from ncdlr.data.features import synthetic_features, write_feature_table
from ncdlr.service.evaluate import evaluate_run, same_accuracy
from ncdlr.service.local import local_state

KS, KU = 4, 4


def _run_dir(tmp_path, *, novel_test_rows: bool):
    x, y, s = synthetic_features(num_known=KS, num_novel=KU, dim=8, n_max=20, ratio=4, test_per_class=3, seed=2)
    if not novel_test_rows:  # the test split holds known classes only
        keep = ~((s == "test") & (y >= KS))
        x, y, s = x[keep], y[keep], s[keep]
    table = str(tmp_path / "features.parquet")
    write_feature_table(table, x, y, s, num_known=KS, num_novel=KU)
    cfg = Config()
    cfg.data.features = table
    cfg.model.encoder, cfg.model.head, cfg.model.feature_dim = "identity", "mlp", 8
    run = tmp_path / "run"
    run.mkdir()
    save_config(cfg, run / "config.yaml")
    torch.manual_seed(0)
    state = local_state(cfg, build_model(cfg.model, KS, KU), 1)
    save_state(run / "checkpoint", state, buffer=None, rng=[rng_state()], config=cfg.to_dict())
    return run


def test_a_test_split_without_novel_images_reports_novel_as_null(tmp_path):
    run = _run_dir(tmp_path, novel_test_rows=False)
    metrics = evaluate_run(run, str(run / "checkpoint"))
    assert metrics["novel"] is None
    assert json.loads((run / "metrics.json").read_text())["novel"] is None
    assert 0.0 <= metrics["known"] <= 1.0


def test_a_test_split_with_novel_images_reports_a_novel_accuracy(tmp_path):
    run = _run_dir(tmp_path, novel_test_rows=True)
    metrics = evaluate_run(run, str(run / "checkpoint"))
    assert 0.0 <= metrics["novel"] <= 1.0


@pytest.mark.parametrize("reported, computed, same", [
    (None, float("nan"), True), (float("nan"), float("nan"), True), (None, 0.5, False), (0.5, float("nan"), False),
    (0.5, 0.5 + 1e-12, True), (0.5, 0.6, False),
])
def test_same_accuracy_treats_none_and_nan_as_undefined(reported, computed, same):
    assert same_accuracy(reported, computed) is same
