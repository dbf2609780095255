"""Encoders by name, freezing, DINO checkpoint loading, heads of width ≥ K-1 over fixed ETF prototypes."""

import pytest
import timm
import torch

from ncdlr.models import PretrainedWeightsWarning, build_encoder, build_head, build_model
from ncdlr.models.heads import Head, NCDModel
from ncdlr.service.config import ModelConfig


def test_tiny_cnn_gives_one_feature_per_image():
    enc = build_encoder("tiny_cnn", trainable_blocks=-1)
    assert enc(torch.rand(3, 3, 32, 32)).shape == (3, enc.feature_dim)


def _trainable_names(encoder):
    return {n for n, p in encoder.backbone.named_parameters() if p.requires_grad}


def test_timm_vit_trains_only_the_last_block_and_final_norm():
    with pytest.warns(PretrainedWeightsWarning, match="NO pre-trained weights"):
        enc = build_encoder("vit_tiny_patch16_224", trainable_blocks=1)
    names = _trainable_names(enc)
    assert names and all(n.startswith(("blocks.11.", "norm.")) for n in names)
    assert any(n.startswith("norm.") for n in names)
    enc.freeze_all_but_last(0)
    assert not _trainable_names(enc)


def test_too_many_trainable_blocks_is_an_error():
    with pytest.raises(ValueError, match="only 3 blocks"):
        build_encoder("tiny_cnn", trainable_blocks=4)


def test_unknown_encoder_name_is_named():
    with pytest.raises(ValueError, match="no_such_net"):
        build_encoder("no_such_net")


def test_dino_checkpoint_loads_teacher_weights_with_prefixes(tmp_path):
    source = timm.create_model("vit_tiny_patch16_224", num_classes=0)
    torch.nn.init.normal_(source.cls_token)
    state = {f"module.backbone.{k}": v for k, v in source.state_dict().items()}
    state["module.head.mlp.0.weight"] = torch.zeros(3, 3)
    torch.save({"teacher": state, "student": {}, "epoch": 100}, tmp_path / "dino.pth")
    enc = build_encoder("vit_tiny_patch16_224", pretrained=str(tmp_path / "dino.pth"), trainable_blocks=1)
    assert torch.equal(enc.backbone.cls_token, source.cls_token)
    x = torch.rand(1, 3, 224, 224)
    assert torch.allclose(enc(x), source.eval()(x), atol=1e-5)


def test_checkpoint_of_another_architecture_is_refused(tmp_path):
    torch.save({"conv.weight": torch.zeros(1)}, tmp_path / "other.pth")
    with pytest.raises(ValueError, match="other.pth"):
        build_encoder("vit_tiny_patch16_224", pretrained=str(tmp_path / "other.pth"))


def test_efficientnet_lite0_loads_its_bundled_weights():
    enc = build_encoder("efficientnet_lite0", trainable_blocks=1, image_size=64).eval()
    assert enc.input_scaling == "lite" and enc.feature_dim == 1280
    assert enc(torch.rand(2, 3, 64, 64)).shape == (2, 1280)
    trainable = _trainable_names(enc)
    assert "_conv_head.weight" in trainable and "_conv_stem.weight" not in trainable


def test_frozen_batchnorm_stays_in_eval_mode_when_training():
    enc = build_encoder("efficientnet_lite0", trainable_blocks=1, image_size=64).train()
    assert not enc.backbone._bn0.training and enc.backbone._bn1.training


def test_expand_head_is_frozen_and_wide_enough_for_the_etf():
    head = build_head("auto", in_dim=8, num_classes=40)
    assert head.kind == "expand" and head.out_dim >= 39
    assert not list(head.parameters())
    z = head(torch.randn(5, 8))
    assert torch.allclose(z.norm(dim=1), torch.ones(5))


def test_identity_head_narrower_than_k_minus_1_is_refused():
    with pytest.raises(ValueError, match="K - 1"):
        build_head("identity", in_dim=8, num_classes=40)


def test_model_scores_against_fixed_etf_prototypes():
    model = build_model(ModelConfig(encoder="identity", feature_dim=16, head="linear"), num_known=5, num_novel=7)
    assert isinstance(model, NCDModel) and isinstance(model.head, Head)
    p = model.prototypes
    assert p.shape == (16, 12) and not p.requires_grad
    gram = p.T @ p
    assert torch.allclose(gram.diagonal(), torch.ones(12), atol=1e-5)
    assert torch.allclose(gram[0, 1], torch.tensor(-1 / 11), atol=1e-5)
    assert model.novel_prototypes.shape == (16, 7)
    z = model(torch.randn(4, 16))
    assert model.logits(z).shape == (4, 12)
