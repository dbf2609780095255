"""``model.head_init imprint`` in the service: the local loop and the Ray Train worker's build fit the same head on
an activation cache (so every rank starts equal), and ``random`` leaves the seeded init alone. No Ray is started:
the worker's ``build_state`` is called directly, as ``train_worker`` calls it with the feature splits."""

from __future__ import annotations

import torch

from ncdlr.models import build_model
from ncdlr.service.config import Config
from ncdlr.service.run_data import init_head, load_training_data, model_for_table
from ncdlr.service.worker import build_state
from tests.fixtures.activation_caches import write_activation_cache


def _cache_config(folder) -> Config:
    parts = {"known": (3, [0, 1, 0, 1, 1, 0, 1]), "novel": (3, [2, 3, 3, 2, 2, 3, 2]), "test": (1, [0, 1, 2, 3])}
    cfg = Config()
    cfg.data.features = write_activation_cache(folder, parts, num_known=2)
    cfg.data.batch_size = 4
    cfg.model.encoder, cfg.model.head, cfg.model.head_init = "identity", "linear", "imprint"
    return cfg


def test_the_worker_build_and_the_local_init_fit_the_same_head_and_random_leaves_the_seeded_one(tmp_path):
    cfg = _cache_config(tmp_path / "cache")
    data = load_training_data(cfg.data)
    model_for_table(cfg, data.features)
    torch.manual_seed(cfg.run.seed)
    seeded = build_model(cfg.model, 2, 2, image_size=cfg.data.image_size)
    local = build_model(cfg.model, 2, 2, image_size=cfg.data.image_size)
    local.load_state_dict(seeded.state_dict())
    fit = init_head(cfg, local, data.features)
    assert set(fit) == {"fit_known", "fit_novel"} and 0 <= fit["fit_known"] <= 1
    assert not torch.equal(local.head.net.weight, seeded.head.net.weight)

    torch.manual_seed(cfg.run.seed)  # as train_worker seeds before building
    state = build_state(cfg, data.summary, steps=2, device=torch.device("cpu"), world=1, features=data.features)
    for name, tensor in local.state_dict().items():
        torch.testing.assert_close(state.model.state_dict()[name], tensor, msg=name)

    cfg.model.head_init = "random"
    untouched = build_model(cfg.model, 2, 2, image_size=cfg.data.image_size)
    untouched.load_state_dict(seeded.state_dict())
    assert init_head(cfg, untouched, data.features) is None
    assert torch.equal(untouched.head.net.weight, seeded.head.net.weight)
