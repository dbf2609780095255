"""The evaluation report of a run (method.md §5): metrics, predictions, plots and a Markdown summary.

:func:`write_run_report` writes into the run directory

===========================  ===============================================================================
``metrics.json``             ``ncdlr.metrics.cluster_accuracy`` (All/Known/Novel class-mean and instance, H/M/T)
                             merged with ``extra_metrics`` (e.g. final τ, bad images); NaN is written as null
``predictions.parquet``      one row per evaluated image: source_id, y_true, y_pred, y_pred_mapped (Hungarian,
                             -1 when the predicted cluster is unmatched), true/predicted class names
``confusion_novel.png``      row-normalised confusion of the novel classes after the Hungarian mapping, classes
                             sorted by training count (head → tail); predictions outside them in an "other" column
``tau.png``                  τ of the adaptive cluster-size prior over training steps
``head_medium_tail.png``     class-mean accuracy of head/medium/tail groups, known and novel
``summary.md``               :func:`render_summary`
===========================  ===============================================================================

Plots use Matplotlib's Agg backend (no display needed).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ncdlr.metrics import GROUPS, cluster_accuracy, hungarian_mapping

METRICS_FILE = "metrics.json"
PREDICTIONS_FILE = "predictions.parquet"
CONFUSION_PLOT = "confusion_novel.png"
TAU_PLOT = "tau.png"
HMT_PLOT = "head_medium_tail.png"
SUMMARY_FILE = "summary.md"
PREDICTIONS_METADATA_KEY = b"ncdlr_report"


class ReportError(ValueError):
    """A run directory or report input that cannot be used; the message names it."""


# ---------------------------------------------------------------------------------------------- helpers


def novel_class_order(num_known: int, train_counts: Sequence[int]) -> list[int]:
    """Novel class ids ``Ks..K-1`` sorted by training count, largest first (ties by id).

    The same order as ``ncdlr.metrics.head_medium_tail``, so the confusion plot reads head → tail.
    """
    return sorted(range(num_known, len(train_counts)), key=lambda c: (-int(train_counts[c]), c))


def novel_confusion(y_true: np.ndarray, y_mapped: np.ndarray, order: Sequence[int]) -> np.ndarray:
    """Row-normalised confusion of the novel classes in ``order``.

    Args:
        y_true: ``[N]`` true labels.
        y_mapped: ``[N]`` predictions after the Hungarian mapping (-1 = unmatched cluster).
        order: the ``Ku`` novel class ids, in display order.

    Returns:
        ``[Ku, Ku + 1]`` float: row ``i`` = fraction of class ``order[i]``'s test images predicted as
        ``order[j]``; the last column collects predictions outside ``order`` (known classes, unmatched).
        Rows of classes without test images are zero.
    """
    position = {c: i for i, c in enumerate(order)}
    other = len(order)
    counts = np.zeros((len(order), len(order) + 1))
    for t, p in zip(y_true, y_mapped):
        if int(t) in position:
            counts[position[int(t)], position.get(int(p), other)] += 1
    totals = counts.sum(axis=1, keepdims=True)
    return np.divide(counts, totals, out=np.zeros_like(counts), where=totals > 0)


def _json_safe(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (np.floating, np.integer)):
        return _json_safe(value.item())
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# ------------------------------------------------------------------------------------------------ plots


def plot_novel_confusion(path: Path, confusion: np.ndarray, order: Sequence[int], train_counts: Sequence[int],
                         class_names: Sequence[str], split: str) -> None:
    """Heat map of :func:`novel_confusion`; class names on the axes when there are at most 40 classes."""
    plt = _pyplot()
    ku = len(order)
    side = min(4 + 0.28 * ku, 16)
    fig, ax = plt.subplots(figsize=(side + 1.5, side), dpi=110)
    image = ax.imshow(100 * confusion, cmap="viridis", vmin=0, vmax=100, aspect="auto", interpolation="nearest")
    fig.colorbar(image, ax=ax, label=f"% of the true class's {split} images")
    if ku <= 40:
        names = [f"{class_names[c]} ({int(train_counts[c])})" for c in order]
        ax.set_yticks(range(ku), names, fontsize=7)
        ax.set_xticks(range(ku + 1), [*names, "other"], fontsize=7, rotation=90)
    else:
        ax.set_xticks([ku], ["other"])
    ax.set_ylabel("true novel class (training images), head → tail")
    ax.set_xlabel("predicted class after Hungarian mapping, same order; 'other' = known or unmatched")
    ax.set_title(f"Novel-class confusion on {split} (rows sum to 100 %)")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_tau(path: Path, tau_history: Sequence[tuple[int, float]]) -> None:
    """τ over training steps (log scale when it spans more than a factor 10)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4), dpi=110)
    if tau_history:
        steps, taus = zip(*tau_history)
        ax.plot(steps, taus, color="C0", lw=1.5)
        if max(taus) / max(min(taus), 1e-12) > 10:
            ax.set_yscale("log")
        ax.set_title(f"Imbalance factor τ of the cluster-size prior (final τ = {taus[-1]:.3g})")
    else:
        ax.text(0.5, 0.5, "no τ recorded (non-adaptive prior)", ha="center", va="center", transform=ax.transAxes)
        ax.set_title("Imbalance factor τ of the cluster-size prior")
    ax.set_xlabel("training step")
    ax.set_ylabel("τ = largest / smallest prior cluster size (1 = uniform)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_head_medium_tail(path: Path, metrics: Mapping[str, float], split: str) -> None:
    """Grouped bars: head/medium/tail class-mean accuracy (%) of the known and the novel classes."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4), dpi=110)
    x = np.arange(len(GROUPS))
    for offset, half, color in ((-0.2, "known", "C0"), (0.2, "novel", "C1")):
        values = [metrics.get(f"{half}_{g}", float("nan")) for g in GROUPS]
        heights = [0.0 if v is None or not math.isfinite(v) else 100 * v for v in values]
        bars = ax.bar(x + offset, heights, width=0.4, color=color, label=half)
        labels = ["n/a" if v is None or not math.isfinite(v) else f"{100 * v:.1f}" for v in values]
        ax.bar_label(bars, labels=labels, fontsize=8, padding=2)
    ax.set_xticks(x, [f"{g}\n({share} of classes)" for g, share in zip(GROUPS, ("30 %", "40 %", "30 %"))])
    ax.set_ylabel(f"class-mean accuracy on {split} (%)")
    ax.set_ylim(0, 120)
    ax.set_title("Accuracy by class frequency (groups by training count)")
    ax.legend(loc="upper center", ncol=2)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# ------------------------------------------------------------------------------------------- the report


def write_run_report(
    run_dir: str | Path,
    *,
    y_true: Sequence[int] | np.ndarray,
    y_pred: Sequence[int] | np.ndarray,
    num_known: int,
    train_counts: Sequence[int],
    class_names: Sequence[str],
    tau_history: Sequence[tuple[int, float]],
    source_ids: Sequence[str] | None = None,
    extra_metrics: Mapping[str, object] | None = None,
    split: str = "test",
) -> dict:
    """Evaluate predictions and write every report artefact (see the module docstring) into ``run_dir``.

    Args:
        run_dir: the run directory (created if missing); ``metrics.json`` lands at its top.
        y_true: ``[N]`` true labels, known ``0..Ks-1``, novel ``Ks..K-1``.
        y_pred: ``[N]`` predicted labels (argmax over the ``K`` prototypes, or any cluster ids).
        num_known: ``Ks``.
        train_counts: ``[K]`` training images per class (orders H/M/T and the confusion plot).
        class_names: ``[K]`` class names by label.
        tau_history: ``(step, τ)`` pairs over training; empty for a non-adaptive prior.
        source_ids: ``[N]`` image ids; default the row index.
        extra_metrics: added to ``metrics.json`` (must not reuse a metric's key).
        split: the evaluated split's name (shown in plots and the summary).

    Returns:
        The metrics dict as written (``cluster_accuracy`` ∪ ``extra_metrics``, NaN → None).
    """
    run = Path(run_dir)
    y_true = np.asarray(y_true, dtype=np.int64)
    y_pred = np.asarray(y_pred, dtype=np.int64)
    num_classes = len(train_counts)
    if y_true.ndim != 1 or y_true.shape != y_pred.shape or y_true.size == 0:
        raise ReportError(f"y_true and y_pred must be non-empty 1-D arrays of equal length, "
                          f"got {y_true.shape} and {y_pred.shape}")
    if len(class_names) != num_classes:
        raise ReportError(f"class_names has {len(class_names)} entries but train_counts has {num_classes}")
    if not 0 < num_known < num_classes:
        raise ReportError(f"num_known must lie in [1, {num_classes - 1}] for {num_classes} classes, got {num_known}")
    if y_true.min() < 0 or y_true.max() >= num_classes:
        raise ReportError(f"y_true has labels outside 0..{num_classes - 1} (min {y_true.min()}, max {y_true.max()})")
    if source_ids is not None and len(source_ids) != y_true.size:
        raise ReportError(f"source_ids has {len(source_ids)} entries for {y_true.size} predictions")
    tau_history = [(int(step), float(tau)) for step, tau in tau_history]

    metrics = cluster_accuracy(y_true, y_pred, num_known, train_counts)
    clash = sorted(set(metrics) & set(extra_metrics or {}))
    if clash:
        raise ReportError(f"extra_metrics reuses computed metric key(s): {', '.join(clash)}")
    metrics = _json_safe({**metrics, **(extra_metrics or {})})
    run.mkdir(parents=True, exist_ok=True)
    (run / METRICS_FILE).write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n")

    mapping = hungarian_mapping(y_true, y_pred)
    y_mapped = np.array([mapping.get(int(p), -1) for p in y_pred], dtype=np.int64)
    names = [str(n) for n in class_names]
    table = pa.table({
        "source_id": pa.array([str(s) for s in source_ids] if source_ids is not None
                              else [str(i) for i in range(y_true.size)], pa.string()),
        "y_true": pa.array(y_true, pa.int32()),
        "y_pred": pa.array(y_pred, pa.int32()),
        "y_pred_mapped": pa.array(y_mapped, pa.int32()),
        "true_class_name": pa.array([names[t] for t in y_true], pa.string()),
        "pred_class_name": pa.array([names[p] if p >= 0 else None for p in y_mapped], pa.string()),
    })
    info = {"split": split, "num_known": int(num_known), "num_classes": num_classes}
    table = table.replace_schema_metadata({PREDICTIONS_METADATA_KEY: json.dumps(info).encode()})
    pq.write_table(table, run / PREDICTIONS_FILE)

    order = novel_class_order(num_known, train_counts)
    plot_novel_confusion(run / CONFUSION_PLOT, novel_confusion(y_true, y_mapped, order), order, train_counts,
                         names, split)
    plot_tau(run / TAU_PLOT, tau_history)
    plot_head_medium_tail(run / HMT_PLOT, metrics, split)
    (run / SUMMARY_FILE).write_text(render_summary(run))
    return metrics


def _check_run_dir(run_dir: str | Path) -> Path:
    run = Path(run_dir)
    if not run.is_dir():
        raise ReportError(f"{run}: run directory not found")
    if not (run / METRICS_FILE).is_file():
        raise ReportError(f"{run}: no {METRICS_FILE} (has the run been evaluated? try `ncdlr evaluate {run}`)")
    return run


def load_metrics(run_dir: str | Path) -> dict:
    """``metrics.json`` of a run directory; :class:`ReportError` naming the directory if absent or unreadable."""
    path = _check_run_dir(run_dir) / METRICS_FILE
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ReportError(f"{path}: not valid JSON ({exc})") from None


def render_summary(run_dir: str | Path) -> str:
    """The Markdown summary of a run: All/Known/Novel (class-mean and instance), H/M/T, other metrics."""
    run = _check_run_dir(run_dir)
    metrics = load_metrics(run)
    split = "test"
    if (run / PREDICTIONS_FILE).is_file():
        meta = pq.read_schema(run / PREDICTIONS_FILE).metadata or {}
        if PREDICTIONS_METADATA_KEY in meta:
            split = json.loads(meta[PREDICTIONS_METADATA_KEY]).get("split", split)

    def pct(key: str) -> str:
        value = metrics.get(key)
        return "n/a" if not isinstance(value, (int, float)) or not math.isfinite(value) else f"{100 * value:.2f}"

    lines = [
        f"# Run report: {run.name}",
        "",
        f"Accuracy (%) on **{split}** under one Hungarian matching over all classes (method.md §5).",
        "",
        "| accuracy | All | Known | Novel |",
        "|---|---:|---:|---:|",
        f"| class-mean | {pct('all')} | {pct('known')} | {pct('novel')} |",
        f"| instance | {pct('all_inst')} | {pct('known_inst')} | {pct('novel_inst')} |",
    ]
    if any(f"novel_{g}" in metrics for g in GROUPS):
        lines += [
            "",
            "Class-mean accuracy (%) by training-count group (30 % head / 40 % medium / 30 % tail of the classes):",
            "",
            "| classes | Head | Medium | Tail |",
            "|---|---:|---:|---:|",
            f"| novel | {' | '.join(pct(f'novel_{g}') for g in GROUPS)} |",
            f"| known | {' | '.join(pct(f'known_{g}') for g in GROUPS)} |",
        ]
    reported = {"all", "known", "novel", "all_inst", "known_inst", "novel_inst",
                *(f"{h}_{g}" for h in ("known", "novel") for g in GROUPS)}
    others = {k: v for k, v in metrics.items() if k not in reported}
    if others:
        lines += ["", "| other | value |", "|---|---|"]
        lines += [f"| {k} | {v:.4g} |" if isinstance(v, float) else f"| {k} | {v} |" for k, v in sorted(others.items())]
    plots = [p for p in (CONFUSION_PLOT, TAU_PLOT, HMT_PLOT) if (run / p).is_file()]
    if plots:
        lines += ["", "Plots: " + ", ".join(f"[{p}]({p})" for p in plots)]
    return "\n".join(lines) + "\n"
