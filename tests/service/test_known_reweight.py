"""``method.known_reweight`` in the service: the Ray Train worker's build and the local loop give the method the same
known-class weights, from the training data's known counts. No Ray is started: the worker's ``build_state`` is
called directly, as ``train_worker`` calls it."""

from __future__ import annotations

import torch

from ncdlr.models import build_model
from ncdlr.service.config import Config
from ncdlr.service.local import local_state
from ncdlr.service.run_data import load_training_data, model_for_table
from ncdlr.service.worker import build_state
from tests.fixtures.activation_caches import write_activation_cache


def test_the_worker_and_the_local_loop_weigh_the_known_rows_by_the_datas_known_counts(tmp_path):
    parts = {"known": (2, [0, 0, 0, 0, 0, 0, 1, 1]), "novel": (2, [2, 3, 3, 2, 2, 3]), "test": (1, [0, 1, 2, 3])}
    cfg = Config()
    cfg.data.features = write_activation_cache(tmp_path / "cache", parts, num_known=2)
    cfg.data.batch_size = 4
    cfg.model.encoder, cfg.model.head = "identity", "linear"
    cfg.method.known_reweight = 1.0
    data = load_training_data(cfg.data)
    model_for_table(cfg, data.features)
    assert data.summary.train_counts[:2] == [6, 2]

    worker = build_state(cfg, data.summary, steps=2, device=torch.device("cpu"), world=1)
    local = local_state(cfg, build_model(cfg.model, 2, 2, image_size=cfg.data.image_size), 2,
                        known_counts=data.features.train_counts()[:2])
    for state in (worker, local):
        torch.testing.assert_close(state.method.known_class_weights, torch.tensor([1 / 3, 1.0]))

    cfg.method.known_reweight = 0.0  # off: no weights, the plain mean
    assert build_state(cfg, data.summary, steps=2, device=torch.device("cpu"), world=1).method.known_class_weights is None
