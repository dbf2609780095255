"""Frozen passes of a fixed size (``ncdlr.models.batching``): the default size per image size, the padding, and an
image's activation independent of the batch it arrived in (a real efficientnet_lite0 stem)."""

from __future__ import annotations

import warnings

import pytest
import torch

from ncdlr.models import build_encoder
from ncdlr.models.batching import fixed_passes, pass_rows


def test_pass_rows_follows_the_pixel_budget_within_one_to_sixty_four():
    assert [pass_rows(s) for s in (32, 64, 96, 160, 224, 512)] == [64, 32, 14, 5, 2, 1]
    assert pass_rows(160, pixels=2 ** 20) == 40
    with pytest.raises(ValueError, match="image_size"):
        pass_rows(0)


def test_every_pass_has_the_same_shape_and_the_padding_is_dropped():
    seen = []

    def fn(b: torch.Tensor) -> torch.Tensor:  # output depends on the pass's size, as a shape-chosen kernel may
        seen.append(b.shape[0])
        return b * b.shape[0]

    x = torch.arange(11.0).reshape(11, 1)
    out = fixed_passes(fn, x, 4)
    assert seen == [4, 4, 4] and out.shape == (11, 1) and torch.equal(out, x * 4)
    assert torch.equal(fixed_passes(fn, x[:3], 4), x[:3] * 4)  # alone or among others: the same values
    assert fixed_passes(fn, x[:0], 4).shape == (0, 1)
    with pytest.raises(ValueError, match="rows"):
        fixed_passes(fn, x, 0)


def test_an_image_gets_the_same_stem_bits_whichever_batch_it_arrives_in():
    """The stem ``ncdlr embed --trainable-blocks 1`` runs, on 20 images that arrive as one batch or as 3 + 17 (what a
    Ray Data block boundary can do): bit-identical through fixed passes. Plain passes of 3 and of 20 rows took
    different kernels here (about 1 % of the float16 values one unit apart); that part is printed, not asserted,
    since which sizes switch kernels depends on the CPU and its threads."""
    torch.set_num_threads(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        enc = build_encoder("efficientnet_lite0", trainable_blocks=0, image_size=64, cached_blocks=1).eval()
    x = torch.rand(20, 3, 64, 64, generator=torch.Generator().manual_seed(0)) * 2 - 1

    def stem(b: torch.Tensor) -> torch.Tensor:
        return enc.stem(b, 1).to(torch.float16)

    with torch.inference_mode():
        whole = fixed_passes(stem, x, 8)
        split = torch.cat([fixed_passes(stem, x[:3], 8), fixed_passes(stem, x[3:], 8)])
        plain = torch.cat([stem(x[:3]), stem(x[3:])])
        plain_whole = stem(x)
    assert torch.equal(whole, split)
    print("plain passes: share of float16 values that differ by batch:",
          (plain != plain_whole).float().mean().item())


@pytest.mark.parametrize("trainable", [1, 2, 0, -1])
def test_an_encoder_on_cpu_runs_its_frozen_part_in_fixed_passes_as_the_same_function(trainable):
    """``Encoder.forward`` on CPU inputs: the frozen part in passes of ``frozen_pass_rows`` images without autograd,
    the trained blocks on the whole batch (in train mode, so their BatchNorm sees the batch). Against one plain
    pass (``frozen_pass_rows = 0``): the same features and the same gradients of the trained parameters to float
    tolerance; nothing frozen gets a gradient; with every block trained (-1) the passes are not used.

    In float64: the check is that the passes compute the same function, not how far float32 rounding travels. In
    float32 the passes' other conv kernels round differently, and two trained blocks' train-mode BatchNorm carried
    that to a 1.1e-3 relative gradient difference in one `make test` run under load (session 61), past the 1e-3
    tolerance the float32 check had; here float64 gives the same bits on both sides."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        enc = build_encoder("efficientnet_lite0", trainable_blocks=trainable, image_size=64).train().double()
    assert enc.frozen_pass_rows == 32 and enc.trainable_blocks == trainable
    x = torch.rand(40, 3, 64, 64, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 2 - 1
    grads, feats = [], []
    for rows in (7, 0):
        enc.frozen_pass_rows = rows
        enc.zero_grad(set_to_none=True)
        torch.manual_seed(0)  # the trained blocks drop connections at random in train mode: the same draws
        out = enc(x)
        feats.append(out.detach())
        if trainable == 0:
            assert not out.requires_grad
            continue
        out.square().sum().backward()
        grads.append({n: p.grad.clone() for n, p in enc.named_parameters() if p.grad is not None})
        assert all(p.grad is None for p in enc.parameters() if not p.requires_grad)
    torch.testing.assert_close(feats[0], feats[1], rtol=1e-9, atol=1e-9)
    if grads:
        assert grads[0].keys() == grads[1].keys() and grads[0]
        for name, g in grads[0].items():  # to the gradient's norm (the loss sums 40 x 1280 squares, and a bias
            # before a BatchNorm has a gradient of ~0)
            assert (g - grads[1][name]).norm() <= 1e-8 * grads[1][name].norm() + 1e-8, name


def test_bench_embed_times_both_sides_and_the_baseline_is_the_old_plain_passes(capsys):
    """``benchmarks/bench_embed.py`` at tiny sizes: one JSON line with both batch kinds and their ratios, and its
    baseline computes the same activations as the shipped actor up to the kernels' rounding."""
    import json

    import numpy as np

    from tests.fixtures.benchmarks import load_benchmark

    bench = load_benchmark("bench_embed")
    assert bench.main(["--size", "32", "--batch", "3", "--views", "2", "--reps", "1"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["pass_rows"] == 64 and report["baseline_rows"] == 64
    assert report["train_ratio"] > 0 and report["eval_fixed_images_per_s"] > 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        actor = bench._StemActor("efficientnet_lite0", "", 32, 1, 1, 4)
    batch = {"valid": np.ones(5, bool), "label": np.zeros(5, np.int64), "split": np.array(["novel"] * 5),
             "source_id": np.array(list("abcde")),
             "image": np.random.default_rng(0).standard_normal((5, 3, 32, 32)).astype(np.float32)}
    np.testing.assert_allclose(bench.baseline(actor, batch).astype(np.float32),
                               actor(batch)["activation"].astype(np.float32), rtol=1e-2, atol=1e-2)
