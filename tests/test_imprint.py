"""The imprinted head (``model.head_init imprint``, ``ncdlr.models.imprint``): k-means, the closed-form ridge fit,
and a model whose head starts where the known labels and the novel rows' clusters put it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ncdlr.data.features import read_feature_table, synthetic_features, write_feature_table
from ncdlr.metrics import cluster_accuracy
from ncdlr.models import build_model
from ncdlr.models.imprint import imprint_head, kmeans, ridge_fit
from ncdlr.service.config import Config, ConfigError, load_config


def _blobs(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((3, 8)) * 6
    truth = np.repeat(np.arange(3), [40, 25, 10])
    return centres[truth] + rng.standard_normal((len(truth), 8)), truth


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kmeans_finds_well_separated_clusters_of_unequal_sizes_whatever_the_seed(seed):
    x, truth = _blobs(7)
    labels = kmeans(x, 3, seed)
    assert labels.shape == truth.shape and set(labels.tolist()) == {0, 1, 2}
    # the same partition up to the names: each true cluster is one label and the labels differ
    assert all(len(set(labels[truth == c].tolist())) == 1 for c in range(3))
    with pytest.raises(ValueError, match="1 ≤ k ≤ rows"):
        kmeans(x[:2], 3, seed)


def test_ridge_fit_recovers_an_affine_map_and_shrinks_it_as_the_ridge_grows():
    gen = torch.Generator().manual_seed(0)
    f = torch.randn(200, 6, generator=gen)
    a, c = torch.randn(4, 6, generator=gen), torch.randn(4, generator=gen)
    weight, bias = ridge_fit(f, f @ a.T + c, ridge=1e-9)
    torch.testing.assert_close(weight, a, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(bias, c, atol=1e-4, rtol=1e-4)
    norms = [float(ridge_fit(f, f @ a.T + c, ridge=r)[0].norm()) for r in (0.1, 1.0, 10.0)]
    assert norms[0] > norms[1] > norms[2]


def _tiny_model(tmp_path, head: str = "linear"):
    x, y, s = synthetic_features(num_known=4, num_novel=3, dim=16, n_max=40, ratio=4, noise=0.3, seed=3)
    write_feature_table(str(tmp_path / "t.parquet"), x, y, s, num_known=4, num_novel=3)
    splits = read_feature_table(str(tmp_path / "t.parquet"))
    cfg = Config()
    cfg.model.encoder, cfg.model.feature_dim, cfg.model.head = "identity", 16, head
    torch.manual_seed(0)
    return build_model(cfg.model, 4, 3), splits


def test_imprinting_sends_known_rows_to_their_prototypes_and_novel_clusters_to_novel_ones(tmp_path):
    """Before any training step, the imprinted model already predicts the known classes and splits the novel rows
    into the true novel classes (the novel labels are read only to score it); a random head does neither."""
    model, splits = _tiny_model(tmp_path)
    known_x, known_y, novel_x = splits.features["known"], splits.labels["known"], splits.features["novel"]
    truth = splits.labels["novel"].numpy()

    def novel_accuracy() -> float:
        with torch.no_grad():
            pred = model.logits(model(novel_x)).argmax(1).numpy()
        return cluster_accuracy(truth, pred, 4)["novel"]

    random_start = novel_accuracy()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    fit = imprint_head(model, known_x, known_y, novel_x, seed=0)
    assert fit["fit_known"] > 0.95 and fit["fit_novel"] > 0.95
    assert novel_accuracy() > 0.95 > random_start
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed == {"head.net.weight", "head.net.bias"}
    assert model.training  # the mode it was in


def test_imprinting_refuses_a_head_it_cannot_fit_and_the_config_says_so_first(tmp_path):
    model, splits = _tiny_model(tmp_path, head="mlp")
    with pytest.raises(ValueError, match="one linear head"):
        imprint_head(model, splits.features["known"], splits.labels["known"], splits.features["novel"], seed=0)
    for overrides in (["--model.head_init=imprint", "--model.head=mlp"],
                      ["--model.head_init=imprint", "--model.head=linear", "--model.heads=2"]):
        with pytest.raises(ConfigError, match="model.head_init imprint fits one linear head"):
            load_config(None, overrides)
    with pytest.raises(ConfigError, match="'sometimes' is not one of random, imprint"):
        load_config(None, ["--model.head_init=sometimes"])
    assert load_config(None, ["--model.head_init=imprint", "--model.head=linear"]).model.head_init == "imprint"
