"""Encoders by name (timm, efficientnet_lite0, tiny CNN, identity) and projection heads."""

from __future__ import annotations

from .encoders import Encoder, PretrainedWeightsWarning, build_encoder, input_scaling
from .heads import Head, HeadView, NCDModel, build_head

__all__ = ["Encoder", "Head", "HeadView", "NCDModel", "PretrainedWeightsWarning", "build_encoder", "build_head", "build_model",
           "input_scaling"]


def build_model(model_cfg, num_known: int, num_novel: int, image_size: int = 224) -> NCDModel:
    """Build ``NCDModel`` from a :class:`ncdlr.service.config.ModelConfig`."""
    encoder = build_encoder(model_cfg.encoder, pretrained=model_cfg.pretrained,
                            trainable_blocks=model_cfg.trainable_blocks, image_size=image_size,
                            feature_dim=model_cfg.feature_dim, cached_blocks=getattr(model_cfg, "cached_blocks", 0))
    heads = [build_head(model_cfg.head, encoder.feature_dim, num_known + num_novel, model_cfg.head_dim,
                        seed=model_cfg.prototype_seed + 1009 * h) for h in range(max(1, getattr(model_cfg, "heads", 1)))]
    return NCDModel(encoder, heads[0], num_known, num_novel, prototype_seed=model_cfg.prototype_seed,
                    learnable_prototypes=getattr(model_cfg, "prototypes", "etf") == "learnable", extra_heads=heads[1:])
