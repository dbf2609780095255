"""Training checkpoints: everything needed for an exact resume, loadable with ``torch.load(weights_only=True)``.

A checkpoint is one file ``state.pt`` holding only tensors, numbers, strings, lists and dicts:

* ``model``: the trainable parameters and all buffers (prototypes ``P``, a frozen head expansion, BatchNorm
  statistics) — frozen encoder weights are rebuilt from the config (and ``--pretrained``) instead;
* ``optimizer`` (AdamW), ``scheduler`` (LambdaLR position), ``labeler`` (``t`` and its SGD state);
  ``extra_labelers`` with ``model.heads`` > 1 (heads 1..H-1; the predicting head is the model's ``selected_head``);
* ``buffer``: the shared FIFO of novel logits (``LogitBuffer.state_dict()``) and ``step`` (global step of
  its last push);
* ``rng``: per-rank torch (and CUDA) generator states; ``epoch`` (epochs completed); ``config``;
  ``metrics`` of the last epoch and ``tau_history`` (τ after every step, for the report);
* ``average`` (only with ``optim.average_epochs`` > 0): the weights' moving average, ``{"model": model_state,
  "n_averaged": count}``. Evaluation, prediction and export read it instead of ``model``
  (:func:`inference_state`); ``model`` stays the last iterate that training resumes from;
* ``teacher`` (only with ``optim.teacher_epochs`` > 0): the mean teacher that labels the novel rows, in the same
  form; training only (evaluation never reads it).
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import torch
from torch import nn

FORMAT_VERSION = 1
FILENAME = "state.pt"


class CheckpointError(ValueError):
    """A checkpoint is missing, of an unknown version, or does not fit the model (names the file)."""


def model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Trainable parameters and all buffers of ``model`` (detached CPU copies)."""
    state = {name: p.detach().cpu().clone() for name, p in model.named_parameters() if p.requires_grad}
    state.update({name: b.detach().cpu().clone() for name, b in model.named_buffers()})
    return state


def load_model_state(model: nn.Module, state: dict[str, torch.Tensor], source: str = "checkpoint") -> None:
    """Load :func:`model_state` output; every trainable parameter must be present and every key known."""
    own = dict(model.named_parameters()) | dict(model.named_buffers())
    unknown = sorted(set(state) - set(own))
    if unknown:
        raise CheckpointError(f"{source}: keys not in the model: {unknown[:5]}")
    missing = sorted(n for n, p in model.named_parameters() if p.requires_grad and n not in state)
    if missing:
        raise CheckpointError(f"{source}: trainable parameters missing: {missing[:5]}")
    with torch.no_grad():
        for name, value in state.items():
            if own[name].shape != value.shape:
                raise CheckpointError(f"{source}: {name} has shape {tuple(value.shape)}, model wants {tuple(own[name].shape)}")
            own[name].copy_(value)


def cpu_state(module: nn.Module) -> dict[str, Any]:
    """``module.state_dict()`` with its tensors as detached CPU copies (extra state, e.g. an optimiser's, as is)."""
    return {k: v.detach().cpu().clone() if torch.is_tensor(v) else v for k, v in module.state_dict().items()}


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def save_checkpoint(directory: str | Path, *, model: nn.Module, optimizer: torch.optim.Optimizer,
                    scheduler: Any, labeler: nn.Module | None, buffer: dict | None, step: int, epoch: int,
                    rng: list[dict[str, Any]], config: dict, metrics: dict[str, float] | None = None,
                    tau_history: list[float] | None = None, average: nn.Module | None = None,
                    extra_labelers: nn.Module | None = None, teacher: nn.Module | None = None) -> Path:
    """Write ``directory/state.pt`` atomically (temp file then rename) and return its path. ``average``: a
    ``torch.optim.swa_utils.AveragedModel`` of ``model`` (``optim.average_epochs``), saved as well;
    ``extra_labelers``: the labelers of heads 1..H-1 (``model.heads`` > 1), saved when there are any; ``teacher``:
    the ``AveragedModel`` whose labels the run trains on (``optim.teacher_epochs``), saved as well."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    payload = {
        "format_version": FORMAT_VERSION,
        "model": model_state(model),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "labeler": {} if labeler is None else cpu_state(labeler),
        "buffer": buffer,
        "step": int(step),
        "epoch": int(epoch),
        "rng": rng,
        "config": config,
        "metrics": dict(metrics or {}),
        "tau_history": [float(v) for v in (tau_history or [])],
    }
    for key, averaged in (("average", average), ("teacher", teacher)):
        if averaged is not None:
            payload[key] = {"model": model_state(averaged.module), "n_averaged": int(averaged.n_averaged)}
    if extra_labelers is not None and len(extra_labelers):
        payload["extra_labelers"] = cpu_state(extra_labelers)
    tmp = directory / (FILENAME + ".tmp")
    torch.save(payload, tmp)
    tmp.replace(directory / FILENAME)
    return directory / FILENAME


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read a checkpoint (a ``state.pt`` or a directory holding one, local or s3://) with ``weights_only=True``."""
    text = str(path)
    if text.startswith("s3://"):
        from ncdlr.models.encoders import read_bytes

        uri = text if text.endswith(".pt") else text.rstrip("/") + "/" + FILENAME
        source: Any = io.BytesIO(read_bytes(uri))
        name = uri
    else:
        file = Path(text)
        if file.is_dir():
            file = file / FILENAME
        if not file.is_file():
            raise CheckpointError(f"checkpoint {str(file)!r} does not exist")
        source, name = file, str(file)
    try:
        payload = torch.load(source, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises several types for corrupt/unsafe files
        raise CheckpointError(f"checkpoint {name!r} cannot be read: {err}") from err
    if not isinstance(payload, dict) or payload.get("format_version") != FORMAT_VERSION:
        version = payload.get("format_version") if isinstance(payload, dict) else None
        raise CheckpointError(f"checkpoint {name!r} has unknown format version {version!r} (expected {FORMAT_VERSION})")
    payload["source"] = name
    return payload


def inference_state(payload: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The weights to evaluate, predict with and export from a checkpoint ``payload``: the moving average when the
    run kept one (``optim.average_epochs``), else the last iterate (``model``)."""
    average = payload.get("average")
    return average["model"] if average else payload["model"]


def save_state(directory: str | Path, state, *, buffer: dict | None, rng: list[dict[str, Any]], config: dict,
               metrics: dict[str, float] | None = None) -> Path:
    """Checkpoint a :class:`~ncdlr.service.train_loop.WorkerState` (rank 0's model and moving average, shared
    labeler/buffer)."""
    return save_checkpoint(directory, model=state.model, optimizer=state.optimizer, scheduler=state.scheduler,
                           labeler=state.labeler, buffer=buffer, step=state.step, epoch=state.epoch, rng=rng,
                           config=config, metrics=metrics, tau_history=state.tau_history, average=state.average,
                           extra_labelers=state.method.extra_labelers, teacher=state.teacher)


def restore_state(state, payload: dict[str, Any], rank: int = 0) -> dict | None:
    """Load a checkpoint ``payload`` into ``state`` in place; returns the buffer state to give the buffer.

    Rank ``r`` gets its own saved RNG state when the checkpoint has one for it (same world size), else rank 0's.
    """
    source = payload.get("source", "checkpoint")
    load_model_state(state.model, payload["model"], source)
    state.model.to(state.device)
    state.optimizer.load_state_dict(payload["optimizer"])
    state.scheduler.load_state_dict(payload["scheduler"])
    if state.labeler is not None:
        state.labeler.load_state_dict(payload["labeler"])
    extra = state.method.extra_labelers
    if len(extra):
        if "extra_labelers" not in payload:
            raise CheckpointError(f"{source}: no labelers for heads 1..{len(extra)} (a checkpoint of a one-head run; "
                                  "model.heads must match the run that wrote it)")
        extra.load_state_dict(payload["extra_labelers"])
    state.method.active_head = state.model.selected
    state.step = int(payload["step"])
    state.epoch = int(payload["epoch"])
    state.tau_history = list(payload.get("tau_history", []))
    for key, averaged in (("average", state.average), ("teacher", state.teacher)):
        if averaged is None:
            continue
        saved = payload.get(key)
        if saved:  # the moving average goes on where it stopped
            load_model_state(averaged.module, saved["model"], source)
            averaged.n_averaged.fill_(int(saved["n_averaged"]))
        else:  # a checkpoint from a run without one: the average starts over from the restored weights
            load_model_state(averaged.module, payload["model"], source)
            averaged.n_averaged.zero_()
    rng = payload.get("rng") or []
    if rng:
        set_rng_state(rng[rank] if rank < len(rng) else rng[0])
    return payload.get("buffer")
