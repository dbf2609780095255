"""Typed run configuration: dataclasses loaded from ``configs/*.yaml`` and overridden from the command line.

One source of truth for every knob of a training run. A YAML file has one mapping per section
(``data``, ``model``, ``labeler``, ``optim``, ``run``); the command line overrides any field with
``--section.key value`` or, when the key name is unique across sections, ``--key value``
(dashes and underscores are interchangeable). Unknown sections/keys and values of the wrong type
are rejected with a :class:`ConfigError` that names the key. The resolved config is written to the
run directory as ``config.yaml`` so a run can be re-created and evaluated later.

Each layer owns its own section: ``labeler`` and ``method`` are the method layer's
(:mod:`ncdlr.method_settings`); the labeler and the method are built straight from them. A method's
:attr:`~ncdlr.methods.Method.requires` (UNO: learnable prototypes, no buffer) are applied under the settings
given explicitly (YAML or command line), and an explicit contradiction is refused (:func:`resolve`). A method's
:attr:`~ncdlr.methods.Method.file_resets` (UNO: held cluster sizes) undo what a config file set for the method it
was written for, when the method was chosen elsewhere (``--config configs/openclipart.yaml --method.name uno``).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ncdlr.method_settings import LabelerConfig, MethodConfig

log = logging.getLogger(__name__)


class ConfigError(ValueError):
    """A configuration key is unknown, ambiguous or has a value of the wrong type (the message names it)."""


@dataclass
class DataConfig:
    """Where the training data comes from and how it is batched."""

    uri: str = ""  #: prepared image dataset (manifest + parquet shards), local path or s3://
    features: str = ""  #: feature table (parquet: embedding, label, split) — feature-table mode when set
    endpoint_url: str = ""  #: S3 endpoint override (else AWS_ENDPOINT_URL / AWS defaults)
    batch_size: int = 128  #: per worker and per half: B known + B novel rows each step (paper: 128)
    eval_batch_size: int = 256
    image_size: int = 224  #: crop size fed to the encoder
    crop_scale_min: float = 0.5  #: RandomResizedCrop lower scale bound for the two views
    photometric: str = "none"  #: colour augmentation of the two views after crop and flip: "none" | "uno" (UNO's discovery views, which the paper's code inherits: colour jitter p 0.5, greyscale p 0.1, Gaussian blur p 0.2). Image mode with decode_on host; an activation cache holds what `ncdlr embed --photometric` gave its crops (set from the table)
    feature_noise: float = 0.0  #: feature-table mode: std of Gaussian noise making the two "views"
    max_steps_per_epoch: int = 0  #: feature-table mode: cap on steps per epoch; 0 → a full pass over the novel split
    epochs_per_execution: int = 1  #: image mode: epochs of the training splits each Ray Data execution streams, each re-shuffled (an execution's start costs a second or two of little decoding: worth it on epochs of seconds; docs/benchmarks.md "Epoch restarts")
    decode_on: str = "host"  #: image mode: where training images are decoded and augmented: "host" (Ray Data read tasks, PIL, on every free CPU) | "device" (the worker's device: Ray Data ships the encoded bytes) | "hybrid" (read tasks decode, the worker's device crops and resizes). docs/benchmarks.md "GPU input path" compares them


@dataclass
class ModelConfig:
    """Encoder f, head g and the fixed ETF prototypes (method.md §2)."""

    encoder: str = "vit_base_patch16_224"  #: any timm name, "efficientnet_lite0", "tiny_cnn" or "identity"
    pretrained: str = ""  #: DINO-format checkpoint, local path or s3:// (timm encoders); empty → warning
    trainable_blocks: int = 1  #: last N encoder blocks trained (paper: 1); -1 → all, 0 → none
    head: str = "auto"  #: "auto" | "identity" | "expand" (frozen random) | "linear" | "mlp" (trainable)
    head_dim: int = 0  #: output width D of the head; 0 → max(encoder width, K)
    prototype_seed: int = 0  #: seed of the simplex ETF prototypes (stored in every checkpoint)
    feature_dim: int = 0  #: input width for encoder "identity" (feature-table mode); 0 → from the table
    cached_blocks: int = 0  #: set from an activation table (ncdlr embed --trainable-blocks B): the encoder takes the cached activations at the input of its last B blocks
    heads: int = 1  #: H discovery heads trained side by side on the shared encoder, each with its own self-labeling (and buffer); after each epoch the head with the lowest novel loss is the one that predicts (UNO's multi-head, label-free). 1 → the paper's single head
    prototypes: str = "etf"  #: "etf" (fixed simplex ETF, the paper) | "learnable" (normalised, trained; uno/autonovel need it)
    head_init: str = "random"  #: "random" (seeded default init) | "imprint" (feature tables and activation caches, linear head, one head: before training, the closed-form ridge fit of the head that sends the known rows to their class prototypes and the novel rows' k-means clusters of the initial features to the novel prototypes; ncdlr.models.imprint). Measured (results.md, session 32): it fixes the start but training stays in the k-means clustering, −4.3 novel points pooled over two OpenClipart-LT partitions, so random stays the default
    num_novel: str = "0"  #: novel clusters Ku: "0" → the data's number of novel classes; N → N clusters; "auto" → ncdlr.estimate_k on the known+novel training features first (image mode embeds them with the frozen model.encoder first)


@dataclass
class OptimConfig:
    """AdamW with linear warm-up then cosine decay (method.md §7)."""

    epochs: int = 50
    lr: float = 1e-3
    min_lr: float = 1e-4
    weight_decay: float = 1.5e-4
    warmup_epochs: float = 3.0
    known_warmup_epochs: float = 0.0  #: epochs at the start on the known classes alone (no self-labeling, no novel loss; the novel rows still pass through the encoder): the first pseudo-labels come from an encoder and head already shaped by the known classes, not from a random head (UNO's supervised stage, the paper's appendix E set-up). Counted in optim.epochs
    alpha: float = 1.0  #: α in L = L_s + α L_u
    mixup: float = 0.0  #: a > 0: mixup across the images of a batch with λ ~ Beta(a, a) (0 = off, the paper's step). The second view of every known and novel row is blended with another row's, and L gains L_s^mix + α L_u^mix against the same blend of the targets (one-hot labels; the novel pseudo-labels of the other view); targets, OT and buffer stay on the clean views. On an activation cache the blend is of the activations before the trained blocks (manifold mixup). One extra forward of 2B rows per step
    teacher_epochs: float = 0.0  #: H > 0: the novel targets come from a mean teacher, an exponential moving average of the weights with a horizon of H epochs (decay 1 − 1/(H·steps per epoch)), run without gradient in eval mode on the novel views: its logits are what the discovery step solves and the buffer keeps, and the model trains on its labels (0 = off: the model labels itself, the paper's step). Evaluation and export stay the trained model's. One extra forward of the 2B novel rows per step. Measured (results.md, session 56): at H = 0.5 −1.85 novel points (SE 1.26) over four partitions of three real sets, the pool clustered worse and the seeds agreeing less; H = 2 worse again; so 0 stays the default
    average_epochs: float = 0.0  #: H > 0: also keep an exponential moving average of the weights (parameters and batch-norm buffers) with a horizon of H epochs (decay 1 − 1/(H·steps per epoch)), and evaluate, predict and export it instead of the last iterate (0 = off: the last iterate, the paper's)
    amp: bool = True  #: bfloat16 autocast on GPU (ignored on CPU)
    compile: bool = False  #: torch.compile the training forward (inductor; the first steps compile: minutes on a big encoder). docs/benchmarks.md, "GPU step", has what it gives
    channels_last: bool = False  #: keep the encoder's weights and the image batches in channels-last memory order (faster convolutions on GPUs: CNN encoders)


@dataclass
class RunConfig:
    """Where the run lives and how it is scaled."""

    output: str = "runs/latest"  #: run directory (config.yaml, metrics.json, report, TensorBoard)
    storage_path: str = ""  #: Ray Train checkpoint storage (local or s3://); empty → <output>/ray
    shared_storage: bool = False  #: a local storage_path is a filesystem every node mounts (NFS, ...): needed for a local path on a multi-node cluster
    name: str = "ncdlr"
    num_workers: int = 1
    use_gpu: str = "auto"  #: "auto" | "true" | "false"
    cpus_per_worker: float = 1.0  #: fractional values leave CPUs for Ray Data read tasks
    seed: int = 0
    max_failures: int = 0  #: Ray Train FailureConfig(max_failures)
    checkpoints_to_keep: int = 2
    checkpoint_every_s: float = 60.0  #: checkpoint (and ray.train.report) at the end of the first epoch this many seconds after the last checkpoint, and after the last epoch; 0 → every epoch (the γ search forces 0: ASHA scores every epoch). A failure loses at most this much training
    checkpoint_upload: str = "async"  #: "async": Ray Train uploads the checkpoint to run.storage_path in the background while the next epoch trains; "sync": the epoch waits for it
    resume: str = ""  #: checkpoint directory to resume from (exact resume)
    log_every: int = 20  #: steps between progress lines in the job log
    evaluate: bool = True  #: evaluate on the test split and write the report after training
    verbose: bool = False  #: also show Ray's own output (worker logs, report dicts, checkpoint lines) and full tracebacks
    overwrite: bool = False  #: replace a run already in run.output (config.yaml or metrics.json there); else such a run directory is refused


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    labeler: LabelerConfig = field(default_factory=LabelerConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    run: RunConfig = field(default_factory=RunConfig)
    method: MethodConfig = field(default_factory=MethodConfig)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return dataclasses.asdict(self)


_CHOICES: dict[str, tuple[str, ...]] = {
    "model.head": ("auto", "identity", "expand", "linear", "mlp"),
    "model.prototypes": ("etf", "learnable"),
    "model.head_init": ("random", "imprint"),
    "method.loss": ("auto", "mse", "ce"),
    "method.known_loss": ("auto", "mse", "ce"),
    "method.posthoc": ("none", "la", "crt", "la+crt"),
    "run.use_gpu": ("auto", "true", "false"),
    "data.decode_on": ("host", "device", "hybrid"),
    "data.photometric": ("none", "uno"),
    "run.checkpoint_upload": ("async", "sync"),
}


def _sections() -> dict[str, type]:
    return {f.name: typing.get_type_hints(Config)[f.name] for f in dataclasses.fields(Config)}


def _coerce(key: str, value: Any, kind: type, *, from_text: bool) -> Any:
    """Return ``value`` as ``kind`` or raise ConfigError naming ``key``.

    A number field also takes a string that parses as that number from YAML, not only from the command line:
    PyYAML (YAML 1.1) reads ``lr: 1e-3`` as the string ``"1e-3"``, while ``--optim.lr 1e-3`` is text anyway.
    A bool is never a number, and a non-numeric string is refused either way.
    """
    if isinstance(value, str) and (from_text or kind in (int, float)):
        text = value.strip()
        if kind is bool:
            lowered = text.lower()
            if lowered in ("true", "1", "yes", "on"):
                return True
            if lowered in ("false", "0", "no", "off"):
                return False
            raise ConfigError(f"config key {key!r}: expected a boolean (true/false), got {value!r}")
        if kind is int:
            try:
                return int(text)
            except ValueError:
                raise ConfigError(f"config key {key!r}: expected an integer, got {value!r}") from None
        if kind is float:
            try:
                return float(text)
            except ValueError:
                raise ConfigError(f"config key {key!r}: expected a number, got {value!r}") from None
        return text
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind is str and isinstance(value, bool):
        return "true" if value else "false"
    if kind is str and isinstance(value, int):  # YAML `num_novel: 30`
        return str(value)
    if type(value) is not kind:
        raise ConfigError(
            f"config key {key!r}: expected {kind.__name__}, got {type(value).__name__} ({value!r})"
        )
    return value


def _choices(key: str) -> tuple[str, ...] | None:
    """The allowed values of ``key``; priors and methods come from their registries (imported only here, so that
    ``--help`` and reading a config file do not import torch)."""
    if key == "labeler.prior":
        from ncdlr.priors import PRIORS

        return tuple(PRIORS)
    if key == "method.name":
        return tuple(_methods())
    return _CHOICES.get(key)


def _prior_learns(kind: str) -> bool:
    """Whether the prior ``kind`` has a learned parameter (its registry entry says; imported only when asked)."""
    from ncdlr.priors import PRIORS

    return PRIORS[kind].learns


_MINIMUM: dict[str, float] = {"run.checkpoint_every_s": 0.0, "data.epochs_per_execution": 1,
                              "labeler.gamma_per_cluster": 0.0, "labeler.reg_m": 0.0, "labeler.max_imbalance": 0.0,
                              "labeler.relax_after_epochs": 0.0, "labeler.buffer_epochs": 0.0,
                              "optim.known_warmup_epochs": 0.0, "optim.mixup": 0.0,
                              "optim.average_epochs": 0.0, "optim.teacher_epochs": 0.0, "model.heads": 1,
                              "method.task_weight": 0.0, "method.known_reweight": 0.0,
                              "method.novel_reweight": 0.0,
                              # counts and sizes: a run needs at least one of each (-1 = all blocks / Ray's retry
                              # forever where the key says so; 0 = off / from the data where it says so)
                              "optim.epochs": 1, "data.batch_size": 1, "data.eval_batch_size": 1,
                              "data.image_size": 1, "data.max_steps_per_epoch": 0, "data.feature_noise": 0.0,
                              "model.trainable_blocks": -1, "model.head_dim": 0, "model.feature_dim": 0,
                              "model.cached_blocks": 0, "model.prototype_seed": 0, "labeler.n_iters": 1,
                              "labeler.outer_steps": 1, "labeler.buffer_size": 1, "labeler.lr": 0.0,
                              "optim.min_lr": 0.0, "optim.weight_decay": 0.0, "optim.warmup_epochs": 0.0,
                              "optim.alpha": 0.0, "run.num_workers": 1, "run.seed": 0, "run.max_failures": -1,
                              "run.checkpoints_to_keep": 1, "run.log_every": 0, "method.topk": 1,
                              "method.consistency": 0.0, "method.crt_epochs": 0}  #: numeric keys with a lower bound
#: numeric keys that must be above a bound (a step size, a temperature, a share of a CPU): key → (low, high or None),
#: ``low < value`` and, with a high, ``value <= high`` (``value < high`` for the momentum)
_OPEN_RANGE: dict[str, tuple[float, float | None]] = {"labeler.eps": (0.0, None), "labeler.gamma": (0.0, None),
                                                      "optim.lr": (0.0, None), "method.temperature": (0.0, None),
                                                      "run.cpus_per_worker": (0.0, None),
                                                      "data.crop_scale_min": (0.0, 1.0)}


def _as_share(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan


def _check_choice(key: str, value: Any) -> None:
    if key in _MINIMUM and value < _MINIMUM[key]:
        raise ConfigError(f"config key {key!r}: must be >= {_MINIMUM[key]:g}, got {value!r}")
    if key in _OPEN_RANGE:
        low, high = _OPEN_RANGE[key]
        if not value > low or (high is not None and value > high):
            span = f"in ({low:g}, {high:g}]" if high is not None else f"> {low:g}"
            raise ConfigError(f"config key {key!r}: must be {span}, got {value!r}")
    if key == "labeler.momentum" and not 0 <= value < 1:
        raise ConfigError(f"config key {key!r}: must be in [0, 1) (SGD momentum of t), got {value!r}")
    if key == "labeler.size_floor":
        if value not in ("none", "known") and not 0 < _as_share(value) <= 1:
            raise ConfigError(f"config key {key!r}: expected 'none', 'known' or a share in (0, 1], got {value!r}")
        return
    if key == "labeler.relax_bound":
        if value not in ("none", "known") and not _as_share(value) > 1:
            raise ConfigError(f"config key {key!r}: expected 'none', 'known' or an imbalance > 1 (largest over smallest "
                              f"cluster), got {value!r}")
        return
    if key == "labeler.relax_tighten":
        if not (value == 0 or value > 1):
            raise ConfigError(f"config key {key!r}: expected 0 (hold the sizes once past labeler.relax_bound) or a "
                              f"factor > 1 on labeler.reg_m, got {value!r}")
        return
    if key == "model.num_novel":
        if value != "auto" and not (value.isdigit()):
            raise ConfigError(f"config key {key!r}: expected 'auto' or a non-negative integer "
                              f"(0 = from the data), got {value!r}")
        return
    choices = _choices(key)
    if choices is not None and value not in choices:
        raise ConfigError(f"config key {key!r}: {value!r} is not one of {', '.join(choices)}")


def _set(cfg: Config, key: str, value: Any, *, from_text: bool) -> None:
    section_name, _, name = key.partition(".")
    sections = _sections()
    if section_name not in sections:
        raise ConfigError(f"unknown config section {section_name!r} in key {key!r} (sections: {', '.join(sections)})")
    section = getattr(cfg, section_name)
    hints = typing.get_type_hints(type(section))
    if name not in hints:
        raise ConfigError(f"unknown config key {key!r} (known in {section_name}: {', '.join(hints)})")
    kind = hints[name]
    if isinstance(kind, types.UnionType):
        raise ConfigError(f"config key {key!r} has an unsupported type {kind}")
    coerced = _coerce(key, value, kind, from_text=from_text)
    _check_choice(key, coerced)
    setattr(section, name, coerced)


@dataclass(frozen=True)
class Setting:
    """One value given explicitly: ``key`` is ``section.key`` (or a unique bare key); command-line values are
    text (``from_text``), YAML values typed."""

    key: str
    value: Any
    from_text: bool = False
    source: str = ""  #: where it was given (a YAML file): errors name it


def _methods() -> dict:
    from ncdlr.methods import METHODS

    return METHODS


def _apply_file_resets(cfg: Config, sources: dict[str, str]) -> None:
    """Undo a config file's settings that ``cfg.method.name`` does not take from a file (``Method.file_resets``) when
    the method was chosen elsewhere than that file; log each. ``sources``: key → the file that set it last, ``""``
    for the command line or code."""
    method = cfg.method.name
    for key, value in _methods()[method].file_resets.items():
        section, _, name = key.partition(".")
        source, current = sources.get(key, ""), getattr(getattr(cfg, section), name)
        if source and source != sources.get("method.name", "") and current != value:
            setattr(getattr(cfg, section), name, value)
            log.warning("%s sets %s=%r for the method it was written for; method.name=%r trains with %s=%r (give "
                        "--%s on the command line to keep the file's value)", source, key, current, method, key,
                        value, key)


def _apply_method_requirements(cfg: Config, explicit: set[str]) -> None:
    """Set what ``cfg.method.name`` requires (``Method.requires``); refuse an explicit contradiction."""
    for key, needed in _methods()[cfg.method.name].requires.items():
        section, _, name = key.partition(".")
        current = getattr(getattr(cfg, section), name)
        if key in explicit and current != needed:
            raise ConfigError(f"method.name={cfg.method.name!r} needs {key}={needed!r}, but the config sets "
                              f"{key}={current!r}; drop that setting or change it")
        setattr(getattr(cfg, section), name, needed)


#: giving the first key resets the second: of two ways to say one thing, the one given last wins
_RESETS: dict[str, tuple[str, Any]] = {"labeler.gamma": ("labeler.gamma_per_cluster", 0.0)}


def resolve(settings: list[Setting]) -> Config:
    """The Config of the built-in defaults, the method's requirements and ``settings`` (later ones win; e.g.
    ``--gamma 10`` over a config file's ``gamma_per_cluster``: :data:`_RESETS`).

    Every key and value is checked once here (:class:`ConfigError` names the key).
    """
    cfg = Config()
    sources: dict[str, str] = {}  # key → the file that set it last ("" for the command line or code)
    for setting in settings:
        try:
            key = resolve_key(setting.key)
            _set(cfg, key, setting.value, from_text=setting.from_text)
            if key in _RESETS:
                _set(cfg, *_RESETS[key], from_text=False)
        except ConfigError as err:
            raise ConfigError(f"{setting.source}: {err}" if setting.source else str(err)) from None
        sources[key] = "" if setting.from_text else setting.source
    _apply_file_resets(cfg, sources)
    _apply_method_requirements(cfg, set(sources))
    if cfg.optim.known_warmup_epochs and cfg.optim.known_warmup_epochs >= cfg.optim.epochs:
        raise ConfigError(f"optim.known_warmup_epochs={cfg.optim.known_warmup_epochs:g} leaves none of the "
                          f"{cfg.optim.epochs} epochs (optim.epochs) for discovering the novel classes; lower it")
    discovery_epochs = cfg.optim.epochs - cfg.optim.known_warmup_epochs
    if cfg.labeler.relax_after_epochs and cfg.labeler.relax_after_epochs >= discovery_epochs:
        raise ConfigError(f"labeler.relax_after_epochs={cfg.labeler.relax_after_epochs:g} holds the cluster sizes for "
                          f"all {discovery_epochs:g} epochs of self-labeling (optim.epochs − optim.known_warmup_epochs), "
                          f"so labeler.reg_m never relaxes them; lower it, or set labeler.reg_m 0 for held sizes")
    if cfg.labeler.relax_tighten > 0 and cfg.labeler.reg_m > 0 and cfg.labeler.relax_bound == "none":
        raise ConfigError(f"labeler.relax_tighten={cfg.labeler.relax_tighten:g} acts on the epochs whose pseudo-labels "
                          f"run past labeler.relax_bound, which is none: set labeler.relax_bound (known, or a number > 1)")
    if 0 < cfg.labeler.max_imbalance <= 1:
        raise ConfigError(f"labeler.max_imbalance={cfg.labeler.max_imbalance:g}: an imbalance (largest over smallest "
                          f"size) is > 1, or 0 for the known classes' own")
    if cfg.labeler.size_floor != "none" and (cfg.labeler.reg_m <= 0 or (_prior_learns(cfg.labeler.prior)
                                                                       and cfg.method.name != "uno")):
        raise ConfigError(f"labeler.size_floor holds relaxed sizes under a prior that does not learn: it needs "
                          f"labeler.reg_m > 0 and labeler.prior uniform (or fixed); got reg_m={cfg.labeler.reg_m:g}, "
                          f"prior={cfg.labeler.prior!r}")
    if cfg.model.head_init == "imprint" and (cfg.model.head != "linear" or cfg.model.heads != 1):
        raise ConfigError(f"model.head_init imprint fits one linear head: it needs model.head linear and model.heads 1; "
                          f"got head {cfg.model.head!r}, heads {cfg.model.heads}")
    if cfg.model.heads > 1 and cfg.method.name == "autonovel":
        raise ConfigError("model.heads > 1 needs a self-labeling method (ncdlr or uno); autonovel has one head")
    if cfg.method.known_reweight > 0 and cfg.optim.mixup > 0:
        raise ConfigError("method.known_reweight > 0 does not combine with optim.mixup yet (the mixed rows' known term "
                          "would stay unweighted); set one of them back (known_reweight 0 or mixup 0)")
    if cfg.method.novel_reweight > 0 and (cfg.method.name == "autonovel" or cfg.model.heads > 1 or cfg.optim.mixup > 0):
        raise ConfigError(f"method.novel_reweight > 0 weighs the pseudo-labelled rows by their clusters' sizes in one "
                          f"head's solve: it needs a self-labeling method (ncdlr or uno), model.heads 1 and "
                          f"optim.mixup 0; got method {cfg.method.name!r}, heads {cfg.model.heads}, "
                          f"mixup {cfg.optim.mixup:g}")
    if cfg.model.heads > 1 and cfg.optim.mixup > 0:
        raise ConfigError("model.heads > 1 does not combine with optim.mixup yet; set one of them back (heads 1 or "
                          "mixup 0)")
    if cfg.data.photometric != "none":  # the data plane's check, imported only then (PIL)
        from ncdlr.data.transforms import check_photometric

        try:
            check_photometric(cfg.data.photometric, cfg.data.decode_on, prefix="data.")
        except ValueError as err:
            raise ConfigError(str(err)) from None
    return cfg


def dict_settings(data: dict[str, Any] | None, source: str = "") -> list[Setting]:
    """``{section: {key: value}}`` → settings given in ``source`` (their errors name it); a malformed mapping
    raises ConfigError."""
    if data is None:
        return []
    if not isinstance(data, dict):
        raise ConfigError(f"config must be a mapping of sections, got {type(data).__name__}")
    out = []
    for section_name, values in data.items():
        if section_name not in _sections():
            raise ConfigError(f"unknown config section {section_name!r} (sections: {', '.join(_sections())})")
        if not isinstance(values, dict):
            raise ConfigError(f"config section {section_name!r} must be a mapping, got {type(values).__name__}")
        out += [Setting(f"{section_name}.{name}", value, source=source) for name, value in values.items()]
    return out


def yaml_settings(path: str | Path) -> list[Setting]:
    """The settings of a YAML config file (sections → keys)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"config file {str(path)!r} is not valid YAML: {err}") from None
    try:
        return dict_settings(data, str(path))  # each key and value is checked once, by resolve(), naming the file
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None


def override_settings(overrides: list[str]) -> list[Setting]:
    """``["--key", "value", "--section.key=value", ...]`` → settings (values as text)."""
    out: list[Setting] = []
    i = 0
    while i < len(overrides):
        token = overrides[i]
        if not token.startswith("--"):
            raise ConfigError(f"expected an option --key, got {token!r}")
        body = token[2:]
        if "=" in body:
            key, value = body.split("=", 1)
            i += 1
        else:
            if i + 1 >= len(overrides):
                raise ConfigError(f"config key {body!r} has no value")
            key, value = body, overrides[i + 1]
            i += 2
        out.append(Setting(key, value, from_text=True))
    return out


def from_dict(data: dict[str, Any] | None) -> Config:
    """Build a Config from a nested mapping ``{section: {key: value}}``; unknown keys raise ConfigError."""
    return resolve(dict_settings(data))


def load_yaml(path: str | Path) -> Config:
    """Read a YAML config file (sections → keys) on top of the defaults."""
    return resolve(yaml_settings(path))


def resolve_key(key: str) -> str:
    """Map ``section.key`` or a unique bare ``key`` (dashes allowed) to ``section.key``."""
    key = key.replace("-", "_")
    if "." in key:
        return key
    owners = [s for s, kind in _sections().items() if key in typing.get_type_hints(kind)]
    if not owners:
        raise ConfigError(f"unknown config key {key!r}")
    if len(owners) > 1:
        raise ConfigError(f"config key {key!r} is ambiguous; write one of {', '.join(f'{o}.{key}' for o in owners)}")
    return f"{owners[0]}.{key}"


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Defaults ← the method's requirements ← YAML file (if any) ← command-line overrides."""
    return resolve((yaml_settings(path) if path else []) + override_settings(list(overrides or [])))


def save_config(cfg: Config, path: str | Path) -> None:
    """Write the resolved config as YAML (re-loadable with :func:`load_yaml`)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))


def _field_docs() -> dict[str, str]:
    """``section.key`` → the ``#:`` comment next to the field in this module (for ``--help``)."""
    import inspect
    import re

    docs: dict[str, str] = {}
    for section, kind in _sections().items():
        for line in inspect.getsource(kind).splitlines():
            match = re.match(r"\s+(\w+): .*?#: (.*)$", line)
            if match:
                docs[f"{section}.{match.group(1)}"] = match.group(2)
    return docs


def add_override_arguments(parser, exclude: tuple[str, ...] = ()) -> None:
    """Register every config field as ``--section.key`` (and ``--key`` when unique) on an argparse parser.

    Values stay text here; :func:`args_settings` hands the given ones to :func:`resolve`, which checks them
    (so type errors name the key, as for YAML). ``exclude``: ``section.key`` fields a command sets itself.
    """
    defaults = Config().to_dict()
    docs = _field_docs()
    counts: dict[str, int] = {}
    for section, values in defaults.items():
        for key in values:
            counts[key] = counts.get(key, 0) + 1
    group = parser.add_argument_group("config overrides (any field of configs/*.yaml; default from the YAML file)")
    for section, values in defaults.items():
        for key, default in values.items():
            if f"{section}.{key}" in exclude:
                continue
            flags = [f"--{section}.{key}"]
            if counts[key] == 1:
                flags.insert(0, f"--{key.replace('_', '-')}")
                if "_" in key:
                    flags.insert(1, f"--{key}")
            flags = [f for f in flags if f not in parser._option_string_actions]  # the command's own flags win
            group.add_argument(*flags, dest=f"override:{section}.{key}", default=None, metavar="V",
                               help=f"{docs.get(f'{section}.{key}', '')} [built-in default: {default!r}]")


def args_settings(args) -> list[Setting]:
    """The settings of every override flag given on the command line (:func:`add_override_arguments`)."""
    return [Setting(dest[len("override:"):], value, from_text=True)
            for dest, value in vars(args).items() if dest.startswith("override:") and value is not None]
