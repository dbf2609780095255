"""``model.heads`` > 1 (UNO's multi-head): heads on one encoder, one labeler and buffer slice each, the head with
the lowest novel loss predicts. One head keeps every key and every number of the single-head model."""

from __future__ import annotations

import pytest
import torch

from ncdlr.buffer import LocalBuffer
from ncdlr.labeler import AdaptiveSelfLabeler
from ncdlr.methods import Discovery, MethodConfigError, build_method
from ncdlr.method_settings import LabelerConfig, MethodConfig
from ncdlr.models import build_model
from ncdlr.service.config import ConfigError, ModelConfig, Setting, resolve
from ncdlr.service.local import local_state
from ncdlr.service.train_loop import PairedBatch, run_epoch, select_head, train_step

KS, KU, DIM = 3, 4, 12


def model_config(heads: int, head: str = "linear", prototypes: str = "etf") -> ModelConfig:
    return ModelConfig(encoder="identity", feature_dim=DIM, head=head, heads=heads, prototypes=prototypes)


def test_one_head_adds_nothing_to_the_state_dict_and_several_heads_share_the_encoder():
    torch.manual_seed(0)
    one = build_model(model_config(1), KS, KU)
    assert one.num_heads == 1 and one.selected == 0
    assert not any(k.startswith(("extra_", "selected")) for k in one.state_dict())  # old checkpoints keep loading
    three = build_model(model_config(3), KS, KU)
    x = torch.randn(5, DIM)
    z = three(x, all_heads=True)
    assert z.shape == (3, 5, three.head.out_dim)
    assert torch.allclose(z.norm(dim=-1), torch.ones(3, 5), atol=1e-5)
    assert not torch.allclose(z[0], z[1])  # the heads start apart
    assert torch.equal(three(x), z[0])  # head 0 predicts until one is selected
    three.select_head(2)
    assert three.selected == 2 and torch.equal(three(x), z[2])
    assert torch.equal(three.logits(three(x)), z[2] @ three.class_prototypes(2))
    assert torch.equal(three.state_dict()["selected_head"], torch.tensor(2))
    with pytest.raises(ValueError, match="out of range"):
        three.select_head(3)


def test_learnable_prototypes_are_per_head_and_the_fixed_etf_is_shared():
    etf = build_model(model_config(2), KS, KU)
    assert torch.equal(etf.class_prototypes(0), etf.class_prototypes(1))
    learnable = build_model(model_config(2, prototypes="learnable"), KS, KU)
    p0, p1 = learnable.class_prototypes(0), learnable.class_prototypes(1)
    assert p0.requires_grad and p1.requires_grad and not torch.allclose(p0, p1)
    assert torch.equal(learnable.head_view(1).class_prototypes(), p1)


def test_identical_heads_are_refused():
    """Identity heads against the one fixed ETF would give every head the same embeddings and labels."""
    with pytest.raises(ValueError, match="model.heads > 1 needs heads that differ"):
        build_model(ModelConfig(encoder="identity", feature_dim=DIM, head="identity", heads=2), 2, 2)


def test_h_labelers_on_one_wide_buffer_equal_h_separate_discovery_steps():
    """Columns ``h·Ku..`` of the scores and of the shared buffer rows are head h's problem alone: two heads in one
    discovery step give, step after step, the labels and τ of two single-head steps with their own buffers."""
    g = torch.Generator().manual_seed(3)
    wide = Discovery([AdaptiveSelfLabeler(KU, gamma=2.0) for _ in range(2)], LocalBuffer(24, 2 * KU))
    alone = [Discovery(AdaptiveSelfLabeler(KU, gamma=2.0), LocalBuffer(24, KU)) for _ in range(2)]
    valid = torch.tensor([True, True, False, True, True, True])
    for step in range(5):
        scores = torch.rand(2, 6, 2 * KU, generator=g) * 2 - 1
        both, _ = wide(scores, valid, step)
        assert both.shape == (2, 6, 2 * KU)
        for h in range(2):
            single, _ = alone[h](scores[..., h * KU:(h + 1) * KU].contiguous(), valid, step)
            assert torch.allclose(both[..., h * KU:(h + 1) * KU], single, atol=1e-6)
            assert wide.labelers[h].imbalance_factor == pytest.approx(alone[h].labeler.imbalance_factor, rel=1e-6)
        assert torch.allclose(both[:, valid].sum(-1), torch.full((2, 5), 2.0), atol=1e-5)  # each head's rows sum to 1
    assert wide.labelers[0].imbalance_factor != pytest.approx(wide.labelers[1].imbalance_factor)


@pytest.mark.parametrize("name", ["ncdlr", "uno"])
def test_each_head_gets_its_own_labeler_and_targets(name):
    cfg = MethodConfig(name=name)
    labeler = LabelerConfig(gamma=2.0, use_buffer=name == "ncdlr")
    method = build_method(cfg, labeler, KU, heads=3)
    assert len(method.labelers) == 3 and len({id(lab) for lab in method.labelers}) == 3
    model = build_model(model_config(3, prototypes="learnable" if name == "uno" else "etf"), KS, KU)
    z = model(torch.randn(8, DIM), all_heads=True)
    views = [model.head_view(h) for h in range(3)]
    targets, _ = method.novel_targets_heads(views, z, z.flip(1), torch.ones(8, dtype=torch.bool), 0)
    assert len(targets) == 3
    for h, q in enumerate(targets):
        assert q.shape == (2, 8, KU) and torch.allclose(q.sum(-1), torch.ones(2, 8), atol=1e-5)
        loss = method.novel_loss(views[h], z[h], z.flip(1)[h], q, torch.ones(8, dtype=torch.bool))
        assert loss.item() > 0


def test_autonovel_keeps_one_head():
    with pytest.raises(MethodConfigError, match="one head"):
        build_method(MethodConfig(name="autonovel"), LabelerConfig(use_buffer=False), KU, heads=2)


@pytest.mark.parametrize("settings, message", [
    ({"model.heads": 0}, "model.heads"),
    ({"model.heads": 2, "method.name": "autonovel"}, "autonovel has one head"),
    ({"model.heads": 2, "optim.mixup": 0.5}, "optim.mixup"),
])
def test_the_config_refuses_a_heads_setting_it_cannot_train(settings, message):
    with pytest.raises(ConfigError, match=message):
        resolve([Setting(k, v) for k, v in settings.items()])


def batch_of(g: torch.Generator, b: int = 8) -> PairedBatch:
    known = torch.randint(0, KS, (b,), generator=g)
    centres = torch.eye(DIM) * 3
    novel = torch.randint(KS, KS + KU, (b,), generator=g)

    def view(labels):
        return centres[labels] + 0.5 * torch.randn(b, DIM, generator=g)

    ones = torch.ones(b, dtype=torch.bool)
    return PairedBatch(view(known), view(known), known, ones, view(novel), view(novel), ones)


def test_an_epoch_trains_every_head_and_selects_the_lowest_novel_loss():
    resolved = resolve([Setting("model.encoder", "identity"), Setting("model.head", "linear"),
                        Setting("model.feature_dim", DIM), Setting("model.heads", 3), Setting("labeler.gamma", 2.0),
                        Setting("labeler.buffer_size", 32), Setting("optim.average_epochs", 1.0)])
    torch.manual_seed(0)
    model = build_model(resolved.model, KS, KU)
    state = local_state(resolved, model, steps_per_epoch=6)
    assert len(state.method.labelers) == 3 and state.method.discovery.buffer.buffer.rows.shape[1] == 3 * KU
    before = [h.net.weight.detach().clone() for h in (model.head, *model.extra_heads)]
    g = torch.Generator().manual_seed(1)
    metrics = run_epoch(state, [batch_of(g) for _ in range(6)], resolved.optim)
    losses = [metrics[f"loss_u_head{h}"] for h in range(3)]
    best = min(range(3), key=losses.__getitem__)
    assert metrics["head"] == best and model.selected == best and state.averaged_model().selected == best
    assert state.method.active_head == best
    assert metrics["tau"] == pytest.approx(state.method.labelers[best].imbalance_factor)
    assert all(not torch.equal(b, h.net.weight) for b, h in zip(before, (model.head, *model.extra_heads)))
    assert all(lab.imbalance_factor != pytest.approx(2.0) for lab in state.method.labelers)  # every τ moved
    assert state.head_loss is None and state.head_steps == 0  # the sums start again next epoch
    assert select_head(state) is None and model.selected == best  # nothing new to choose from: kept


def test_a_one_head_step_scores_the_plain_model():
    """``heads = 1``: the step's known loss is the method's known loss of the plain forward (no head axis left in)."""
    resolved = resolve([Setting("model.encoder", "identity"), Setting("model.head", "linear"),
                        Setting("model.feature_dim", DIM), Setting("labeler.gamma", 2.0),
                        Setting("labeler.buffer_size", 32)])
    torch.manual_seed(0)
    model = build_model(resolved.model, KS, KU)
    state = local_state(resolved, model, steps_per_epoch=4)
    batch = batch_of(torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = state.method.known_loss(model, model(batch.known_view1), model(batch.known_view2),
                                           batch.known_labels).item()
    stats = train_step(state, batch, resolved.optim)
    assert stats["loss_s"] == pytest.approx(expected, rel=1e-6)
    assert stats["loss"] == pytest.approx(stats["loss_s"] + stats["loss_u"], rel=1e-6)
    assert "head" not in run_epoch(state, [batch], resolved.optim)
