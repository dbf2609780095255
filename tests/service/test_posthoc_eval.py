"""Post-hoc +LA / +cRT / LA+cRT in the service's evaluation (``method.posthoc``, ``ncdlr evaluate --posthoc``)."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from ncdlr.cli import main as cli_main
from ncdlr.methods.posthoc import logit_adjustment, posthoc_scores, pseudo_label_counts
from ncdlr.metrics import cluster_accuracy
from ncdlr.service.config import ConfigError, load_config
from ncdlr.service.evaluate import evaluate_run
from tests.fixtures.tiny_runs import make_run_dir


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    run, _ = make_run_dir(tmp_path_factory.mktemp("posthoc"))
    return run


def _inputs(seed=0, n=12, nk=10, nu=9, d=6, ks=2, ku=3):
    g = torch.Generator().manual_seed(seed)
    z = lambda m: F.normalize(torch.randn(m, d, generator=g), dim=1)  # noqa: E731
    protos = F.normalize(torch.randn(d, ks + ku, generator=g), dim=0)
    z_test, z_known, z_novel = z(n), z(nk), z(nu)
    known_labels = torch.arange(nk) % ks
    return z_test, z_test @ protos, z_known, known_labels, z_novel, (z_novel @ protos)[:, ks:], protos


def test_none_returns_the_plain_scores():
    args = _inputs()
    assert torch.equal(posthoc_scores("none", *args), args[1])


def test_la_is_the_logit_adjustment_with_the_pseudo_label_prior():
    z_test, logits, z_known, y_known, z_novel, novel_logits, protos = _inputs()
    counts = pseudo_label_counts(y_known, novel_logits, 2)
    expected = logit_adjustment(logits, counts, 0.1)
    assert torch.allclose(posthoc_scores("la", z_test, logits, z_known, y_known, z_novel, novel_logits, protos), expected)


def test_la_leaves_a_class_without_pseudo_labels_unchanged():
    z_test, logits, z_known, y_known, z_novel, novel_logits, protos = _inputs()
    novel_logits = novel_logits.clone()
    novel_logits[:, 2] = -10.0  # novel cluster 2 (class 4) never wins the argmax
    adjusted = posthoc_scores("la", z_test, logits, z_known, y_known, z_novel, novel_logits, protos, temperature=0.5)
    assert torch.allclose(adjusted[:, 4], logits[:, 4] / 0.5)


@pytest.mark.parametrize("kind", ["crt", "la+crt"])
def test_crt_kinds_give_scores_over_all_classes(kind):
    args = _inputs()
    scores = posthoc_scores(kind, *args, crt_epochs=2)
    assert scores.shape == args[1].shape and torch.isfinite(scores).all()


def test_la_plus_crt_is_la_on_the_crt_scores():
    z_test, logits, z_known, y_known, z_novel, novel_logits, protos = _inputs()
    crt = posthoc_scores("crt", z_test, logits, z_known, y_known, z_novel, novel_logits, protos, crt_epochs=2)
    both = posthoc_scores("la+crt", z_test, logits, z_known, y_known, z_novel, novel_logits, protos, crt_epochs=2)
    assert torch.allclose(both, logit_adjustment(crt, pseudo_label_counts(y_known, novel_logits, 2), 0.1))


def test_an_unknown_posthoc_is_refused():
    with pytest.raises(ValueError, match="posthoc"):
        posthoc_scores("lacrt", *_inputs())
    with pytest.raises(ConfigError, match="method.posthoc"):
        load_config(None, ["--posthoc", "lacrt"])


@pytest.mark.parametrize("kind", ["la", "crt", "la+crt"])
def test_evaluate_run_applies_and_labels_the_posthoc(tiny_run, kind):
    plain = evaluate_run(tiny_run, posthoc="none")
    assert plain["posthoc"] == "none" and "without_posthoc_all" not in plain
    fixed = evaluate_run(tiny_run, posthoc=kind)
    written = json.loads((tiny_run / "metrics.json").read_text())
    assert written["posthoc"] == fixed["posthoc"] == kind
    for key in ("all", "known", "novel"):  # the plain numbers are kept next to the fixed ones
        assert written[f"without_posthoc_{key}"] == pytest.approx(plain[key])
        assert 0.0 <= written[key] <= 1.0


def test_evaluate_run_defaults_to_the_runs_method_posthoc(tmp_path):
    run, _ = make_run_dir(tmp_path, method={"posthoc": "la"})
    metrics = evaluate_run(run)
    assert metrics["posthoc"] == "la" and "without_posthoc_novel" in metrics


def test_la_predictions_match_the_report(tiny_run):
    """The report's accuracy is cluster_accuracy of the adjusted predictions written to predictions.parquet."""
    import pyarrow.parquet as pq

    metrics = evaluate_run(tiny_run, posthoc="la")
    table = pq.read_table(tiny_run / "predictions.parquet").to_pydict()
    y_true, y_pred = table["y_true"], table["y_pred"]
    assert cluster_accuracy(y_true, y_pred, 5)["all"] == pytest.approx(metrics["all"])


def test_cli_evaluate_posthoc(tiny_run, capsys):
    assert cli_main(["evaluate", str(tiny_run), "--posthoc", "crt"]) == 0
    assert "| posthoc | crt |" in capsys.readouterr().out
    assert json.loads((tiny_run / "metrics.json").read_text())["posthoc"] == "crt"
    with pytest.raises(SystemExit) as err:
        cli_main(["evaluate", str(tiny_run), "--posthoc", "lacrt"])
    assert err.value.code == 2


@pytest.mark.parametrize("kind", ["none", "la", "crt", "la+crt"])
def test_a_fitted_fix_applies_to_new_rows_as_the_scores_on_the_test_rows_and_survives_a_round_trip(kind):
    """:func:`fit_posthoc` once on the training rows, then :meth:`PosthocFix.apply` to any rows: the same scores as
    :func:`posthoc_scores`, also after ``state`` / ``from_state`` (what ``ncdlr predict`` reads back)."""
    from ncdlr.methods import PosthocFix, fit_posthoc

    z_test, logits, z_known, y_known, z_novel, novel_logits, protos = _inputs()
    fix = fit_posthoc(kind, z_known, y_known, z_novel, novel_logits, protos, crt_epochs=2)
    direct = posthoc_scores(kind, z_test, logits, z_known, y_known, z_novel, novel_logits, protos, crt_epochs=2)
    assert torch.allclose(fix.apply(z_test, logits), direct)
    again = PosthocFix.from_state(fix.state())
    assert torch.allclose(again.apply(z_test[:4], logits[:4]), direct[:4])
    with pytest.raises(ValueError, match="not a post-hoc fix"):
        PosthocFix.from_state({**fix.state(), "kind": "lacrt"})
