"""GPU checks: the labeler, the buffer and the training step on CUDA agree with their CPU versions.

These tests need a CUDA device and are skipped without one (CI has no GPU). They ran on a lent GPU machine
(see docs/benchmarks.md, "GPU"); run them there with ``python -m pytest tests/test_gpu.py --noconftest -q``
(``--noconftest``: the GPU image has no Ray, and nothing here needs it).
"""

from __future__ import annotations

import copy

import pytest
import torch

from ncdlr.buffer import LocalBuffer, LogitBuffer
from ncdlr.labeler import AdaptiveSelfLabeler
from ncdlr.methods.discovery import Discovery
from ncdlr.models import build_model
from ncdlr.service.config import Config
from ncdlr.service.local import local_state
from ncdlr.service.train_loop import PairedBatch, train_step

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
CUDA = torch.device("cuda")


def scores(n: int = 600, k: int = 40, seed: int = 0) -> torch.Tensor:
    """Cosine-like ``[n, k]`` scores with long-tailed cluster sizes (cluster c holds ∝ 0.9^c of the rows)."""
    g = torch.Generator().manual_seed(seed)
    sizes = torch.tensor([0.9**c for c in range(k)])
    labels = torch.multinomial(sizes / sizes.sum(), n, replacement=True, generator=g)
    s = 0.2 * torch.randn(n, k, generator=g)
    s[torch.arange(n), labels] += 0.8
    return s.clamp(-1, 1)


@pytest.mark.parametrize("prior", ["adaptive", "uniform", "free"])
def test_labeler_on_cuda_matches_cpu(prior):
    cpu = AdaptiveSelfLabeler(40, prior=prior, gamma=5.0)
    gpu = copy.deepcopy(cpu).to(CUDA)
    s = scores()
    for _ in range(5):
        q_cpu, q_gpu = cpu(s, last=100), gpu(s.to(CUDA), last=100)
    assert q_gpu.device.type == "cuda"
    torch.testing.assert_close(q_gpu.cpu(), q_cpu, rtol=1e-3, atol=1e-4)
    assert gpu.imbalance_factor == pytest.approx(cpu.imbalance_factor, rel=1e-4)


def test_buffer_lives_on_the_device_and_checkpoints_on_the_host():
    buffer = LogitBuffer(8, 3, device=CUDA)
    out = buffer.push(torch.arange(9.0).view(3, 3).to(CUDA))
    assert out.device.type == "cuda" and out.shape == (8, 3)
    state = buffer.state_dict()
    assert state["rows"].device.type == "cpu"
    restored = LogitBuffer(8, 3, device=CUDA)
    restored.load_state_dict(state)
    assert restored.rows.device.type == "cuda"
    torch.testing.assert_close(restored.rows.cpu(), buffer.rows.cpu())


def tiny_config() -> Config:
    cfg = Config()
    cfg.model.encoder, cfg.model.head, cfg.model.trainable_blocks = "tiny_cnn", "mlp", -1
    cfg.data.batch_size, cfg.data.image_size = 8, 32
    cfg.labeler.gamma, cfg.labeler.buffer_size = 5.0, 32
    cfg.optim.epochs, cfg.optim.warmup_epochs = 1, 0.1
    return cfg


@pytest.mark.parametrize("method", ["ncdlr", "uno", "autonovel"])
def test_train_step_on_cuda_with_amp(method):
    """Three bf16-autocast steps of the real loop on the GPU: finite losses, the buffer fills on the device."""
    cfg = tiny_config()
    cfg.method.name = method
    if method != "ncdlr":  # the baselines learn their prototypes and use no buffer
        cfg.model.prototypes, cfg.labeler.use_buffer = "learnable", False
    torch.manual_seed(0)
    state = local_state(cfg, build_model(cfg.model, 5, 6, image_size=32), 10, CUDA)
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        views = [torch.randn(8, 3, 32, 32, generator=g) for _ in range(4)]
        batch = PairedBatch(views[0], views[1], torch.randint(0, 5, (8,), generator=g), torch.ones(8, dtype=torch.bool),
                            views[2], views[3], torch.ones(8, dtype=torch.bool))
        stats = train_step(state, batch, cfg.optim)
        assert all(torch.isfinite(torch.tensor(stats[k])) for k in ("loss", "loss_s", "loss_u", "tau"))
    if cfg.labeler.use_buffer:
        rows = state.method.discovery.buffer.buffer
        assert rows.rows.device.type == "cuda" and len(rows) == cfg.labeler.buffer_size
    assert state.step == 3


def test_uint8_views_normalised_on_cuda_give_the_host_normalised_step():
    """What a GPU Ray Train worker does (``PairedBatches(normalise=False)``): uint8 views cross to the device and
    ``train_step`` normalises them there; the inputs are the same bits as host-normalised float32 views, so the
    step's loss equals the float32 batch's on the same device."""
    from ncdlr.data.transforms import normalise_chw_torch

    cfg = tiny_config()
    g = torch.Generator().manual_seed(2)
    pixels = [torch.randint(0, 256, (8, 3, 32, 32), generator=g, dtype=torch.uint8) for _ in range(4)]
    for p in pixels:
        assert torch.equal(normalise_chw_torch(p.to(CUDA), "imagenet").cpu(), normalise_chw_torch(p, "imagenet"))
    labels, valid = torch.randint(0, 5, (8,), generator=g), torch.ones(8, dtype=torch.bool)
    valid[-1] = False  # a padded row: uint8 zeros on the device path, float zeros on the host path
    for p in pixels:
        p[-1] = 0
    floats = [normalise_chw_torch(p, "imagenet") for p in pixels]
    for f in floats:
        f[-1] = 0.0
    losses = []
    for batch in (PairedBatch(pixels[0], pixels[1], labels, valid, pixels[2], pixels[3], valid, scaling="imagenet"),
                  PairedBatch(floats[0], floats[1], labels, valid, floats[2], floats[3], valid)):
        torch.manual_seed(0)
        state = local_state(cfg, build_model(cfg.model, 5, 6, image_size=32), 10, CUDA)
        losses.append(train_step(state, batch, cfg.optim)["loss"])
    assert losses[0] == pytest.approx(losses[1], rel=1e-6)


def test_discovery_step_on_cuda_matches_cpu():
    """The GPU path of the discovery step (rows and buffer on the device, invalid rows dropped) gives the CPU
    path's soft labels."""
    s = scores(n=2 * 16, k=6, seed=3).view(2, 16, 6)
    valid = torch.ones(16, dtype=torch.bool)
    valid[[2, 9]] = False
    labeler = AdaptiveSelfLabeler(6, gamma=2.0)
    out = {}
    for device in ("cpu", "cuda"):
        discovery = Discovery(copy.deepcopy(labeler).to(device), LocalBuffer(64, 6, device))
        for step in range(3):
            q, _ = discovery((s + 0.01 * step).to(device), valid.to(device), step)
        out[device] = q.cpu()
    torch.testing.assert_close(out["cuda"], out["cpu"], rtol=1e-3, atol=1e-4)
    assert (out["cuda"][:, ~valid] == 0).all()


@pytest.mark.parametrize("prior,extra", [("adaptive", {}), ("bounded", {"max_imbalance": 30.0}),
                                         ("anchored", {"max_imbalance": 20.0})])
def test_cuda_graph_replay_matches_eager_calls(prior, extra):
    """Captured-graph calls give the eager calls' labels, τ trajectory and momentum; graphs are re-captured
    after a state load and copies of a used labeler work."""
    graphed = AdaptiveSelfLabeler(40, prior=prior, gamma=5.0, **extra).to(CUDA)
    eager = copy.deepcopy(graphed)
    eager.cuda_graphs = False
    for call in range(6):
        s = scores(seed=call).to(CUDA)
        q_graph, q_eager = graphed(s, last=100), eager(s, last=100)
        torch.testing.assert_close(q_graph, q_eager, rtol=1e-5, atol=1e-6)
        assert graphed.imbalance_factor == pytest.approx(eager.imbalance_factor, rel=1e-6)
        assert graphed.last_objective == pytest.approx(eager.last_objective, rel=1e-5)
    assert graphed._graphs, "the graph path was not taken"
    graphed.load_state_dict(eager.state_dict())  # new momentum tensor: the old graph must not be replayed
    twin = copy.deepcopy(graphed)
    for call in range(2):
        s = scores(seed=10 + call).to(CUDA)
        outs = [lab(s) for lab in (graphed, eager, twin)]
        torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(outs[2], outs[1], rtol=1e-5, atol=1e-6)
    assert graphed.imbalance_factor == pytest.approx(eager.imbalance_factor, rel=1e-6)


def test_cuda_graphs_follow_the_relaxations_warm_up_from_held_to_relaxed_sizes():
    """κ is a constant of a captured graph: a labeler whose sizes are held (``sizes_held``, κ = 1) and then relaxed
    (κ = 0.9) replays a graph per κ and follows the eager labeler through the switch."""
    graphed = AdaptiveSelfLabeler(40, gamma=5.0, reg_m=0.45).to(CUDA)
    eager = copy.deepcopy(graphed)
    eager.cuda_graphs = False
    for call in range(6):
        graphed.sizes_held = eager.sizes_held = call < 3
        s = scores(seed=call).to(CUDA)
        torch.testing.assert_close(graphed(s, last=100), eager(s, last=100), rtol=1e-5, atol=1e-6)
        assert graphed.imbalance_factor == pytest.approx(eager.imbalance_factor, rel=1e-6)
    assert len(graphed._graphs) == 2, "one graph per size exponent"


def test_cuda_graph_path_refuses_non_finite_scores_before_touching_t():
    labeler = AdaptiveSelfLabeler(40, gamma=5.0).to(CUDA)
    s = scores().to(CUDA)
    labeler(s)
    labeler(s)  # the second call runs the captured graph
    t_before = float(labeler.prior.t.detach())
    s[3, 4] = float("nan")
    with pytest.raises(ValueError, match="finite"):
        labeler(s)
    assert float(labeler.prior.t.detach()) == t_before


def test_device_views_on_cuda_match_the_same_path_on_the_cpu():
    """The GPU input path (nvJPEG batch decode + roi_align on CUDA) gives the views the CPU device gives
    (libjpeg-turbo + roi_align on the CPU) from the same seed, up to the two JPEG decoders' rounding; a
    truncated JPEG in the batch is invalid on both and does not spoil the others."""
    import io

    import numpy as np
    from PIL import Image

    from ncdlr.data.device_views import DeviceTrainViews

    rng = np.random.default_rng(0)
    data = []
    for w, h in ((320, 240), (500, 375), (320, 240), (64, 80)):
        x, y = np.linspace(0, 1, w)[None, :, None], np.linspace(0, 1, h)[:, None, None]
        pixels = 127 + 90 * np.sin(5 * x ** 2 + 3 * y + rng.uniform(0, 6, (1, 1, 3))) + 10 * rng.standard_normal((h, w, 3))
        out = io.BytesIO()
        Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(out, format="JPEG", quality=90)
        data.append(out.getvalue())
    data.insert(2, data[0][: len(data[0]) // 3])
    views = DeviceTrainViews(size=96, seed=5)
    cpu, cpu_valid = views.raw_views(data, "cpu")
    gpu, gpu_valid = views.raw_views(data, CUDA)
    assert gpu.device.type == CUDA.type
    assert gpu_valid.tolist() == cpu_valid.tolist() == [True, True, False, True, True]
    diff = (gpu.cpu() - cpu).abs().mean(dim=(2, 3, 4))
    assert diff.max() < 2.0, diff


def test_hybrid_views_on_a_cuda_side_stream_match_the_cpu_ones():
    """``decode_on="hybrid"``: host-decoded pixels cropped on CUDA, on the prefetch thread's own stream
    (``on_side_stream``), give the views the CPU device gives from the same seed."""
    import numpy as np

    from ncdlr.data.device_views import DeviceTrainViews, on_side_stream

    g = torch.Generator().manual_seed(0)
    pixels = [torch.randint(0, 256, (h, w, 3), generator=g, dtype=torch.uint8) for h, w in ((240, 320), (375, 500), (240, 320))]
    valid = torch.tensor([True, True, False])
    views = DeviceTrainViews(size=96, seed=2)
    cpu = views.of_pixels(pixels, valid, "cpu")
    gpu = on_side_stream(CUDA, lambda: views.of_pixels(pixels, valid, CUDA))
    assert gpu["view1"].is_cuda and torch.equal(gpu["valid"].cpu(), valid)
    for key in ("view1", "view2"):
        assert torch.allclose(gpu[key].cpu(), cpu[key], atol=1e-3), key
    assert np.isfinite(gpu["view2"].sum().item())
