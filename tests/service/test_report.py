"""Run report (issue 4): metrics.json, predictions.parquet, plots, summary.md and `ncdlr report`."""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from ncdlr.cli import main
from ncdlr.metrics import cluster_accuracy
from ncdlr.service.report import (
    CONFUSION_PLOT,
    HMT_PLOT,
    METRICS_FILE,
    PREDICTIONS_FILE,
    SUMMARY_FILE,
    TAU_PLOT,
    ReportError,
    novel_class_order,
    novel_confusion,
    render_summary,
    write_run_report,
)

NUM_KNOWN = 4
TRAIN_COUNTS = [50, 40, 20, 10, 5, 80, 10, 30, 60, 20]  # novel classes 4..9: sizes 5, 80, 10, 30, 60, 20


@pytest.fixture
def inputs():
    rng = np.random.default_rng(0)
    y_true = np.repeat(np.arange(10), 12)
    # Predictions: a permutation of the labels (cluster ids) with 25 % noise.
    permutation = rng.permutation(10)
    y_pred = permutation[y_true]
    noisy = rng.random(y_true.size) < 0.25
    y_pred[noisy] = rng.integers(0, 10, noisy.sum())
    return {
        "y_true": y_true,
        "y_pred": y_pred,
        "num_known": NUM_KNOWN,
        "train_counts": TRAIN_COUNTS,
        "class_names": [f"class_{c}" for c in range(10)],
        "tau_history": [(step, 1.0 + 0.1 * step) for step in range(0, 100, 10)],
        "source_ids": [f"img_{i:04d}" for i in range(y_true.size)],
        "extra_metrics": {"tau": 10.9, "bad_images": 2},
    }


@pytest.fixture
def run_dir(tmp_path, inputs):
    run = tmp_path / "run"
    write_run_report(run, **inputs)
    return run


def test_every_artefact_exists_and_parses(run_dir, inputs):
    assert json.loads((run_dir / METRICS_FILE).read_text())
    table = pq.read_table(run_dir / PREDICTIONS_FILE)
    assert table.num_rows == len(inputs["y_true"])
    assert set(table.column_names) == {"source_id", "y_true", "y_pred", "y_pred_mapped", "true_class_name",
                                       "pred_class_name"}
    assert table.column("source_id").to_pylist() == inputs["source_ids"]
    for plot in (CONFUSION_PLOT, TAU_PLOT, HMT_PLOT):
        with Image.open(run_dir / plot) as image:
            image.verify()
            assert image.format == "PNG" and min(image.size) >= 300
    assert (run_dir / SUMMARY_FILE).read_text() == render_summary(run_dir)


def test_metrics_json_equals_cluster_accuracy_plus_extras(run_dir, inputs):
    expected = cluster_accuracy(inputs["y_true"], inputs["y_pred"], NUM_KNOWN, TRAIN_COUNTS)
    written = json.loads((run_dir / METRICS_FILE).read_text())
    assert set(written) == set(expected) | {"tau", "bad_images"}
    for key, value in expected.items():
        assert written[key] == pytest.approx(value)
    assert written["tau"] == 10.9 and written["bad_images"] == 2


def test_mapped_predictions_and_names_follow_the_hungarian_mapping(run_dir, inputs):
    table = pq.read_table(run_dir / PREDICTIONS_FILE).to_pydict()
    correct = np.array(table["y_pred_mapped"]) == np.array(table["y_true"])
    assert correct.mean() == pytest.approx(cluster_accuracy(inputs["y_true"], inputs["y_pred"], NUM_KNOWN)["all_inst"])
    for mapped, name in zip(table["y_pred_mapped"], table["pred_class_name"]):
        assert name == (f"class_{mapped}" if mapped >= 0 else None)


def test_nan_metrics_are_written_as_null(tmp_path, inputs):
    inputs["y_true"] = np.repeat(np.arange(9), 12)  # class 9 (a novel tail class) has no test image
    inputs["y_pred"] = inputs["y_true"].copy()
    inputs["source_ids"] = None
    metrics = write_run_report(tmp_path / "run", **inputs)
    written = json.loads((tmp_path / "run" / METRICS_FILE).read_text())
    nan_keys = [k for k, v in cluster_accuracy(inputs["y_true"], inputs["y_pred"], NUM_KNOWN, TRAIN_COUNTS).items()
                if math.isnan(v)]
    assert all(written[k] is None and metrics[k] is None for k in nan_keys)


def test_novel_classes_are_ordered_by_training_count_descending():
    assert novel_class_order(NUM_KNOWN, TRAIN_COUNTS) == [5, 8, 7, 9, 6, 4]


def test_novel_class_order_breaks_ties_by_id():
    assert novel_class_order(1, [9, 3, 7, 3, 7]) == [2, 4, 1, 3]


def test_novel_confusion_rows_follow_the_order_and_sum_to_one():
    order = [5, 4]
    y_true = np.array([4, 4, 5, 5, 5, 5, 0])
    y_mapped = np.array([4, 5, 5, 5, 0, -1, 4])
    confusion = novel_confusion(y_true, y_mapped, order)
    np.testing.assert_allclose(confusion, [[0.5, 0.0, 0.5], [0.5, 0.5, 0.0]])


def test_tau_plot_without_history_is_still_written(tmp_path, inputs):
    inputs["tau_history"] = []
    write_run_report(tmp_path / "run", **inputs)
    assert (tmp_path / "run" / TAU_PLOT).stat().st_size > 0


def test_summary_has_the_all_known_novel_and_hmt_tables(run_dir):
    summary = render_summary(run_dir)
    assert "| accuracy | All | Known | Novel |" in summary
    assert "| class-mean |" in summary and "| instance |" in summary
    assert "| novel |" in summary and "| Head | Medium | Tail |" in summary
    assert "| bad_images | 2 |" in summary and "test" in summary


def test_report_command_prints_the_table(run_dir, capsys):
    assert main(["report", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "| accuracy | All | Known | Novel |" in out
    metrics = json.loads((run_dir / METRICS_FILE).read_text())
    assert f"{100 * metrics['novel']:.2f}" in out


def test_report_command_json_prints_metrics(run_dir, capsys):
    assert main(["report", str(run_dir), "--json"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == json.loads((run_dir / METRICS_FILE).read_text())


def test_report_on_a_missing_run_dir_is_a_clear_error(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nope")]) == 1
    assert "nope: run directory not found" in capsys.readouterr().err


def test_report_on_a_run_dir_without_metrics_is_a_clear_error(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 1
    assert "no metrics.json" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"y_pred": np.zeros(3, dtype=int)}, "equal length"),
        ({"class_names": ["a"]}, "class_names has 1"),
        ({"num_known": 0}, "num_known"),
        ({"source_ids": ["x"]}, "source_ids has 1"),
        ({"extra_metrics": {"novel": 1.0}}, "reuses computed metric key"),
    ],
)
def test_bad_inputs_are_rejected_by_name(tmp_path, inputs, change, message):
    inputs.update(change)
    with pytest.raises(ReportError, match=message):
        write_run_report(tmp_path / "run", **inputs)
    assert not (tmp_path / "run" / METRICS_FILE).exists()


def test_labels_outside_the_classes_are_rejected(tmp_path, inputs):
    inputs["y_true"] = inputs["y_true"].copy()
    inputs["y_true"][0] = 10
    with pytest.raises(ReportError, match="outside 0..9"):
        write_run_report(tmp_path / "run", **inputs)
