"""Evaluate a trained run on its test (or val) split and write the run report (method.md §5).

Predictions are ``argmax_k z·p_k`` over all K classes; metrics come from
:func:`ncdlr.metrics.cluster_accuracy` (one Hungarian matching over all classes; class-mean and instance
accuracies; Head/Medium/Tail by training count), and :func:`ncdlr.service.report.write_run_report` writes
``metrics.json``, ``predictions.parquet``, the plots and ``summary.md`` into the run directory. The checkpoint
evaluated is the last epoch's (never selected on the test set).
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np
import torch

from ncdlr.methods import PosthocFix

from .checkpoint import inference_state, load_checkpoint, load_model_state
from .config import Config, load_yaml
from .fitted_fix import save_fix
from .run_data import TrainingData, load_training_data, pipeline_config

log = logging.getLogger(__name__)


def load_trained_model(cfg: Config, checkpoint: str, num_known: int, num_novel: int):
    """Rebuild the model from ``cfg`` and load the checkpoint's trainable weights and buffers (its moving average
    when the run kept one: :func:`~ncdlr.service.checkpoint.inference_state`)."""
    from ncdlr.models import build_model

    payload = load_checkpoint(checkpoint)
    model = build_model(cfg.model, num_known, num_novel, image_size=cfg.data.image_size)
    load_model_state(model, inference_state(payload), payload["source"])
    return model.eval(), payload


def _test_inputs(cfg: Config, data: TrainingData, split: str) -> tuple[list[torch.Tensor], np.ndarray, list[str] | None]:
    """Eval batches, true labels and source ids of ``split`` (feature table or prepared image dataset)."""
    if data.features is not None:
        if split not in data.features.features:
            raise ValueError(f"the run's feature table {cfg.data.features!r} has no {split!r} split")
        from ncdlr.data.features import first_view

        x = data.features.features[split]
        return ([first_view(part) for part in x.split(cfg.data.eval_batch_size)], data.features.labels[split].numpy(),
                data.features.source_ids.get(split))
    from ncdlr.data import pipeline

    raw = pipeline.load_splits(cfg.data.uri, [split], endpoint_url=cfg.data.endpoint_url or None,
                               manifest=data.manifest)[split]
    ds = pipeline.with_eval_view(raw, pipeline_config(cfg, eval_mode=True))
    inputs, labels, ids, bad = [], [], [], 0
    for batch in ds.iter_batches(batch_size=cfg.data.eval_batch_size, batch_format="numpy"):
        valid = np.asarray(batch["valid"], dtype=bool)
        bad += int((~valid).sum())
        inputs.append(torch.as_tensor(np.ascontiguousarray(batch["image"][valid])))
        labels.append(np.asarray(batch["label"])[valid])
        ids += [str(s) for s, ok in zip(batch["source_id"], valid) if ok]
    if bad:
        log.warning("evaluation: %d undecodable %s image(s) left out", bad, split)
    return inputs, np.concatenate(labels) if labels else np.zeros(0, dtype=np.int64), ids


def evaluate_run(run_dir: str | Path, checkpoint: str = "", split: str = "test", posthoc: str = "",
                 data: TrainingData | None = None) -> dict:
    """Evaluate run ``run_dir`` (its ``config.yaml`` and ``checkpoint`` or ``checkpoint.txt``); write the report.

    ``posthoc`` (``none|la|crt|la+crt``; empty → the run's ``method.posthoc``) applies a post-hoc fix
    (:func:`ncdlr.methods.posthoc.posthoc_scores`) before the report; ``metrics.json`` then holds the fixed
    predictions' metrics, ``posthoc`` naming the fix and ``without_posthoc_all/known/novel`` the plain ones.

    ``data``: the run's data when the caller has read it already (the trainer); else read from the config.

    Returns the metrics dict written to ``metrics.json``.
    """
    from ncdlr.metrics import cluster_accuracy
    from ncdlr.service.report import write_run_report

    from .num_novel import model_num_novel
    from .train_loop import predict

    run_dir = Path(run_dir)
    config_file = run_dir / "config.yaml"
    if not config_file.is_file():
        raise FileNotFoundError(f"run directory {str(run_dir)!r} has no config.yaml (is it a training run?)")
    cfg = load_yaml(config_file)
    if not checkpoint:
        pointer = run_dir / "checkpoint.txt"
        if not pointer.is_file():
            raise FileNotFoundError(f"run directory {str(run_dir)!r} has no checkpoint.txt; pass the checkpoint")
        checkpoint = pointer.read_text().strip()
    data = data or load_training_data(cfg.data)
    summary = data.summary
    model, payload = load_trained_model(cfg, checkpoint, summary.num_known, model_num_novel(cfg, summary))
    device = torch.device("cpu")
    inputs, y_true, source_ids = _test_inputs(cfg, data, split)
    if len(y_true) == 0:
        raise ValueError(f"split {split!r} of the run's data is empty; nothing to evaluate")
    y_pred = predict(model, inputs, device)
    posthoc = posthoc or cfg.method.posthoc
    extra = {"posthoc": posthoc, "num_novel": model.num_novel, **_estimate_metrics(run_dir)}
    if posthoc != "none":
        plain = cluster_accuracy(y_true, y_pred, summary.num_known, summary.train_counts)
        extra.update({f"without_posthoc_{k}": plain[k] for k in ("all", "known", "novel")})
        y_pred, fix = posthoc_predictions(cfg, data, model, inputs, posthoc)
        save_fix(run_dir, checkpoint, fix)  # what `ncdlr predict` applies to new images (ncdlr.service.fitted_fix)
    training = {f"train_{k}": float(v) for k, v in payload.get("metrics", {}).items() if isinstance(v, (int, float))}
    metrics = write_run_report(
        run_dir, y_true=y_true, y_pred=y_pred, num_known=summary.num_known, train_counts=summary.train_counts,
        class_names=summary.class_names, tau_history=list(enumerate(payload.get("tau_history", []), start=1)),
        source_ids=source_ids, extra_metrics={"epochs": payload["epoch"], "steps": payload["step"], **extra, **training},
        split=split,
    )
    check = cluster_accuracy(y_true, y_pred, summary.num_known, summary.train_counts)
    if not same_accuracy(metrics.get("novel"), check["novel"]):
        log.warning("report's novel accuracy %s differs from cluster_accuracy %s", metrics.get("novel"), check["novel"])
    return metrics


def _estimate_metrics(run_dir: Path) -> dict:
    """``num_novel_estimated`` (+ the estimate's seconds) when the run was trained with ``model.num_novel=auto``."""
    from .num_novel import read_estimate

    record = read_estimate(run_dir)
    if record is None:
        return {}
    return {"num_novel_estimated": record["num_novel"], "num_novel_estimate_s": record["seconds"]}


def posthoc_predictions(cfg: Config, data: TrainingData, model, test_inputs: list[torch.Tensor], posthoc: str
                        ) -> tuple[np.ndarray, PosthocFix]:
    """``([N] predictions after the post-hoc fix posthoc, the fix)`` (la | crt | la+crt), on CPU.

    Not under ``no_grad``: cRT trains the classifier. Embeds the test inputs and the known + novel training splits (eval view) with the trained model;
    the novel rows' pseudo-labels are the model's argmax over the novel columns (:func:`ncdlr.methods.fit_posthoc`).
    """
    from ncdlr.methods import build_method, fit_posthoc

    method = build_method(cfg.method, cfg.labeler, model.num_novel)

    @torch.no_grad()
    def embed(inputs: list[torch.Tensor]) -> torch.Tensor:
        parts = [model(x).float() for x in inputs]
        return torch.cat(parts) if parts else torch.zeros(0, model.class_prototypes().shape[0])

    model.eval()
    z_test = embed(test_inputs)
    known_inputs, known_labels, _ = _test_inputs(cfg, data, "known")
    novel_inputs, _, _ = _test_inputs(cfg, data, "novel")
    z_known, z_novel = embed(known_inputs), embed(novel_inputs)
    if len(z_known) == 0 or len(z_novel) == 0:
        raise ValueError(f"posthoc {posthoc!r} needs the known and novel training splits; one is empty")
    ks = model.num_known
    fix = fit_posthoc(posthoc, z_known, torch.as_tensor(known_labels, dtype=torch.long), z_novel,
                      method.predict_logits(model, z_novel)[:, ks:], model.class_prototypes(),
                      temperature=cfg.method.temperature, crt_epochs=cfg.method.crt_epochs, seed=cfg.run.seed)
    return fix.apply(z_test, method.predict_logits(model, z_test)).argmax(1).numpy(), fix


def same_accuracy(reported: float | None, computed: float | None, tol: float = 1e-9) -> bool:
    """Whether two accuracies agree; None and NaN both mean "undefined" (e.g. no novel test images)."""
    def undefined(value: float | None) -> bool:
        return value is None or math.isnan(value)

    if undefined(reported) or undefined(computed):
        return undefined(reported) and undefined(computed)
    return abs(reported - computed) <= tol
