"""``ncdlr predict``: a trained run over a prepared dataset, a folder or s3:// prefix of images, or its feature table.

The image run is a real tiny_cnn run directory (config.yaml, checkpoint, checkpoint.txt) on a real prepared JPEG
dataset; its weights are a seeded random draw rather than trained ones (training adds minutes and nothing to
what is checked here: that ``predict`` applies *the run's* model the way ``evaluate`` does). Images go through the
session's local Ray (Ray Data read tasks and model actors) and, for the s3:// cases, the real rclone S3 server.
"""

from __future__ import annotations

import io
import json

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image

from ncdlr.data.image_files import EmptyImageFolderError
from ncdlr.data.predictions import read_done, read_predictions, read_unreadable
from ncdlr.data.shards import write_dataset
from ncdlr.data.storage import ObjectNotFoundError, resolve
from ncdlr.models import build_model
from ncdlr.service.checkpoint import rng_state, save_state
from ncdlr.service.config import Config, ConfigError, save_config
from ncdlr.service.evaluate import evaluate_run
from ncdlr.service.local import local_state
from ncdlr.service.names import update_names
from ncdlr.service.predict import predict_run, top_classes
from ncdlr.service.trained_run import RunError, open_run
from tests.fixtures.tiny_images import jpeg_bytes, make_tiny_dataset
from tests.fixtures.tiny_runs import make_run_dir

KS, KU = 2, 3


def write_image_run(root, *, seed: int = 0):
    """A prepared dataset (2 known + 3 novel classes, test split) and a run directory of a tiny_cnn model on it."""
    records, classes, info = make_tiny_dataset(train_counts=(14, 8, 12, 6, 4), num_known=KS, test_per_class=4,
                                               size=40, seed=seed)
    write_dataset(str(root / "data"), records, classes, info, progress=False)
    cfg = Config()
    cfg.data.uri, cfg.data.image_size, cfg.data.eval_batch_size = str(root / "data"), 32, 16
    cfg.model.encoder, cfg.model.trainable_blocks, cfg.model.head = "tiny_cnn", -1, "linear"
    run = root / "run"
    run.mkdir()
    save_config(cfg, run / "config.yaml")
    torch.manual_seed(seed)
    model = build_model(cfg.model, KS, KU, image_size=32)
    with torch.no_grad():  # a spread-out random head, so predictions use several classes
        for p in model.head.parameters():
            p.normal_(0, 3.0)
    save_state(run / "checkpoint", local_state(cfg, model, 1), buffer=None, rng=[rng_state()], config=cfg.to_dict())
    (run / "checkpoint.txt").write_text(str(run / "checkpoint") + "\n")
    return run


@pytest.fixture(scope="module")
def image_run(tmp_path_factory):
    run = write_image_run(tmp_path_factory.mktemp("image-run"))
    return run


def image_file(size: tuple[int, int], fmt: str, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(out, format=fmt)
    return out.getvalue()


NEW_IMAGES = {  # a folder of new images: JPEG/PNG/WebP of other sizes, one corrupt file, one non-image file
    "a.jpg": image_file((40, 40), "JPEG", 1),
    "b/wide.png": image_file((300, 90), "PNG", 2),
    "b/tall.webp": image_file((50, 220), "WEBP", 3),
    "c/big.JPEG": image_file((640, 480), "JPEG", 4),
    "c/broken.jpg": b"\xff\xd8\xff\xe0 not really a jpeg",
    "notes.txt": b"not an image",
}


def put_files(uri: str, files: dict[str, bytes]) -> None:
    fs, base = resolve(uri)
    for name, data in files.items():
        if not uri.startswith("s3://"):
            fs.create_dir(f"{base}/{name}".rsplit("/", 1)[0], recursive=True)
        with fs.open_output_stream(f"{base}/{name}") as out:
            out.write(data)


def test_top_classes_gives_argmax_cosine_margin_and_the_ranked_top5():
    logits = torch.tensor([[0.1, 0.9, 0.3, -0.2, 0.5, 0.0], [0.2, 0.25, 0.1, 0.0, -1.0, 0.8]])
    out = top_classes(logits)
    assert out["pred"].tolist() == [1, 5]
    np.testing.assert_allclose(out["confidence"], [0.9, 0.8])
    np.testing.assert_allclose(out["margin"], [0.4, 0.55], atol=1e-6)
    assert out["top"].tolist() == [[1, 4, 2, 0, 5], [5, 1, 0, 2, 3]]
    assert top_classes(logits[:, :3])["top"].shape == (2, 3)  # K < 5: all K classes


def test_predict_over_the_test_split_gives_evaluates_predictions(ray_local, image_run, tmp_path):
    evaluate_run(image_run)
    expected = pq.read_table(image_run / "predictions.parquet").to_pandas().sort_values("source_id")
    stats = predict_run(str(image_run), str(image_run.parent / "data"), str(tmp_path / "pred"), progress=False)
    table, meta = read_predictions(str(tmp_path / "pred"))
    got = table.to_pandas()
    assert stats["rows"] == len(expected) == len(got) and stats["unreadable"] == 0
    assert got.source_id.tolist() == expected.source_id.tolist()
    assert got.pred.tolist() == expected.y_pred.tolist()
    assert got.label.tolist() == expected.y_true.tolist()
    assert len(set(got.pred)) > 1  # the check is not on a constant model
    names = open_run(image_run).names()
    assert got.name.tolist() == [names[p] for p in got.pred]
    assert names[KS:] == ["novel-00", "novel-01", "novel-02"]
    assert (got.is_novel == (got.pred >= KS)).all()
    top = np.stack(got.top5)
    assert (top[:, 0] == got.pred).all() and (got.margin >= 0).all()
    np.testing.assert_allclose(np.stack(got.top5_score)[:, 0], got.confidence)
    assert meta["num_known"] == KS and meta["num_classes"] == KS + KU and meta["kind"] == "dataset"


def test_predict_over_an_s3_prefix_writes_one_row_per_readable_image(ray_local, image_run, s3_bucket, tmp_path):
    put_files(f"{s3_bucket}/new", NEW_IMAGES)
    out = f"{s3_bucket}/predictions"
    stats = predict_run(str(image_run), f"{s3_bucket}/new", out, embeddings=True, progress=False)
    table, meta = read_predictions(out)
    readable = sorted(n for n in NEW_IMAGES if n.endswith((".jpg", ".png", ".webp", ".JPEG")) and "broken" not in n)
    assert table.column("source_id").to_pylist() == readable  # other sizes and formats included, .txt ignored
    assert read_unreadable(out).column("source_id").to_pylist() == ["c/broken.jpg"]  # counted and listed
    assert stats["rows"] == 4 and stats["unreadable"] == 1 and meta["kind"] == "images"
    assert read_done(out)["rows"] == 4  # finished, and marked so (on S3 too)
    assert table.column("label").null_count == 4 and table.column("split").null_count == 4
    z = np.stack(table.column("embedding").to_numpy(zero_copy_only=False))
    np.testing.assert_allclose(np.linalg.norm(z, axis=1), 1.0, atol=1e-5)  # unit-norm z [n, D]


def test_a_resumed_predict_skips_what_is_written_and_refuses_other_settings(ray_local, image_run, tmp_path):
    folder = tmp_path / "new"
    put_files(str(folder), NEW_IMAGES)
    out = str(tmp_path / "pred")
    first = predict_run(str(image_run), str(folder), out, batch_size=2, rows_per_part=1, progress=False)
    parts = sorted((tmp_path / "pred").glob("part-*.parquet"))
    assert first["rows"] == 4 and len(parts) >= 2  # a part per batch of 2 images
    before = read_predictions(out)[0]
    lost = pq.read_table(parts[0]).column("source_id").to_pylist()
    parts[0].unlink()  # as if the job had stopped before this part was written
    again = predict_run(str(image_run), str(folder), out, progress=False)
    assert again["skipped"] == 5 - len(lost) and again["rows"] == len(lost) and again["unreadable"] == 0
    after = read_predictions(out)[0]
    assert after.column("source_id").to_pylist() == before.column("source_id").to_pylist()  # no row twice
    assert after.column("pred").to_pylist() == before.column("pred").to_pylist()
    with pytest.raises(ConfigError, match="made otherwise"):
        predict_run(str(image_run), str(image_run.parent / "data"), out, progress=False)


def test_predict_shows_the_names_a_user_gave(ray_local, tmp_path):
    run = write_image_run(tmp_path, seed=1)
    update_names(run, KU, {"novel-00": "barn owl", "novel-01": "tulip", "novel-02": "fern"})
    predict_run(str(run), str(run.parent / "data"), str(tmp_path / "pred"), progress=False)
    table = read_predictions(str(tmp_path / "pred"))[0].to_pandas()
    named = {KS: "barn owl", KS + 1: "tulip", KS + 2: "fern"}
    assert all(name == named.get(p, f"class_{p}") for p, name in zip(table.pred, table.name))


def test_a_feature_table_run_predicts_its_own_table_as_evaluate_does(tmp_path):
    run, _ = make_run_dir(tmp_path)
    evaluate_run(run)
    expected = pq.read_table(run / "predictions.parquet").column("y_pred").to_pylist()
    predict_run(str(run), str(tmp_path / "features.parquet"), str(tmp_path / "pred"), progress=False)
    table, meta = read_predictions(str(tmp_path / "pred"))
    by_row = sorted(zip(table.column("source_id").to_pylist(), table.column("pred").to_pylist()),
                    key=lambda r: int(r[0].split("/")[1]))
    assert [p for _, p in by_row] == expected and meta["kind"] == "table"


@pytest.mark.parametrize("kind", ["la", "la+crt"])
def test_a_run_with_a_post_hoc_fix_predicts_through_the_fix_its_evaluation_fitted(tmp_path, kind):
    """``method.posthoc``: evaluation fits the fix on the training rows and keeps it beside the run; predict
    applies it, so its predictions over the test rows are the fixed ones evaluate scored, not the plain argmax."""
    run, _ = make_run_dir(tmp_path, method={"posthoc": kind, "crt_epochs": 2})
    metrics = evaluate_run(run)
    assert metrics["posthoc"] == kind and (run / f"posthoc-{kind}.pt").is_file()
    expected = pq.read_table(run / "predictions.parquet").column("y_pred").to_pylist()
    predict_run(str(run), str(tmp_path / "features.parquet"), str(tmp_path / "pred"), split="test", progress=False)
    table, meta = read_predictions(str(tmp_path / "pred"))
    by_row = sorted(zip(table.column("source_id").to_pylist(), table.column("pred").to_pylist()),
                    key=lambda r: int(r[0].split("/")[1]))
    assert [p for _, p in by_row] == expected and meta["posthoc"] == kind
    plain = evaluate_run(run, posthoc="none")  # the fix moves some test rows, so the check above can fail
    assert metrics["without_posthoc_all"] == pytest.approx(plain["all"])
    assert pq.read_table(run / "predictions.parquet").column("y_pred").to_pylist() != expected


def test_a_run_whose_post_hoc_fix_was_never_fitted_for_its_checkpoint_is_refused_with_the_command_that_fits_it(
        tmp_path):
    run, _ = make_run_dir(tmp_path, method={"posthoc": "la"})
    with pytest.raises(RunError, match=r"never fitted \(posthoc-la.pt missing\): `ncdlr evaluate .* --posthoc la`"):
        predict_run(str(run), str(tmp_path / "features.parquet"), str(tmp_path / "pred"), progress=False)
    evaluate_run(run)
    fix = torch.load(run / "posthoc-la.pt", weights_only=True)
    torch.save({**fix, "checkpoint": "/elsewhere/checkpoint"}, run / "posthoc-la.pt")
    with pytest.raises(RunError, match="was fitted for checkpoint '/elsewhere/checkpoint'"):
        predict_run(str(run), str(tmp_path / "features.parquet"), str(tmp_path / "pred"), progress=False)
    assert not (tmp_path / "pred").exists()  # refused before anything is written


def test_a_prediction_folder_made_without_the_fix_is_not_resumed_with_it(tmp_path):
    """Rows predicted plain and rows predicted through +LA never mix in one folder: the resume check names the fix."""
    from ncdlr.service.config import load_yaml

    run, _ = make_run_dir(tmp_path)
    out, table = str(tmp_path / "pred"), str(tmp_path / "features.parquet")
    predict_run(str(run), table, out, progress=False)
    cfg = load_yaml(run / "config.yaml")
    cfg.method.posthoc = "la"
    save_config(cfg, run / "config.yaml")
    evaluate_run(run)  # fits the fix for the run's checkpoint
    with pytest.raises(ConfigError, match="posthoc: 'none' there, 'la' now"):
        predict_run(str(run), table, out, progress=False)


# ---- bad input: each a clear message, nothing written ------------------------------------------------------


def test_an_unknown_run_directory_is_refused(tmp_path):
    with pytest.raises(RunError, match="not found"):
        predict_run(str(tmp_path / "nope"), str(tmp_path), str(tmp_path / "out"))


def test_a_run_without_a_checkpoint_is_refused(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    save_config(Config(), run / "config.yaml")
    with pytest.raises(RunError, match="no checkpoint yet"):
        predict_run(str(run), str(tmp_path), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_an_empty_prefix_or_folder_is_refused(ray_local, image_run, s3_bucket, tmp_path):
    put_files(f"{s3_bucket}/docs", {"readme.txt": b"x"})
    with pytest.raises(EmptyImageFolderError, match="holds no image file.*1 other file"):
        predict_run(str(image_run), f"{s3_bucket}/docs", str(tmp_path / "out"))
    with pytest.raises(ObjectNotFoundError, match="no such folder"):
        predict_run(str(image_run), f"{s3_bucket}/missing", str(tmp_path / "out"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(EmptyImageFolderError):
        predict_run(str(image_run), str(tmp_path / "empty"), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_a_feature_table_is_refused_for_an_image_run(image_run, tmp_path):
    from tests.fixtures.tiny_runs import write_tiny_table

    table = write_tiny_table(tmp_path / "t.parquet")
    with pytest.raises(ConfigError, match="trained on images"):
        predict_run(str(image_run), table, str(tmp_path / "out"))


def test_the_cli_reports_a_bad_run_in_one_line(ray_local, tmp_path, capsys):
    from ncdlr.cli import main

    assert main(["predict", str(tmp_path / "nope"), "--data", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ncdlr predict: run directory") and "not found" in err[0]


def test_the_predict_command_writes_its_stats(ray_local, image_run, tmp_path, capsys):
    from ncdlr.cli import main

    folder = tmp_path / "new"
    put_files(str(folder), {"x.jpg": jpeg_bytes(np.random.default_rng(0), 48)})
    assert main(["predict", str(image_run), "--data", str(folder), "--out", str(tmp_path / "o"), "--no-progress"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert json.loads(lines[-2])["rows"] == 1 and lines[-1] == str(tmp_path / "o")


def test_a_run_with_its_classes_json_predicts_new_images_after_its_data_is_gone(ray_local, tmp_path):
    """``ncdlr train`` writes RUN/classes.json; a run whose training data has gone (the demo's embedded S3 server
    stops with the demo) still predicts new images. Without the file, the missing data is named."""
    import shutil

    from ncdlr.service.config import load_yaml
    from ncdlr.service.run_data import load_training_data, save_summary

    run = write_image_run(tmp_path / "a", seed=4)
    save_summary(load_training_data(load_yaml(run / "config.yaml").data).summary, run)
    shutil.rmtree(run.parent / "data")
    put_files(str(tmp_path / "new"), {"x.jpg": jpeg_bytes(np.random.default_rng(1), 48)})
    assert predict_run(str(run), str(tmp_path / "new"), str(tmp_path / "p1"), progress=False)["rows"] == 1
    assert open_run(run).names() == ["class_0", "class_1", "novel-00", "novel-01", "novel-02"]
    (run / "classes.json").unlink()
    with pytest.raises(ObjectNotFoundError, match="data"):
        predict_run(str(run), str(tmp_path / "new"), str(tmp_path / "p2"), progress=False)


def test_a_run_trained_on_an_activation_cache_scores_images_as_it_scores_their_cached_activations(tmp_path):
    """A tiny_cnn cache run (random frozen stem drawn from the cache's fixed seed): its image model on images equals
    the trained model on the stem's activations of the same images, so predict on new images applies the very
    function that was trained and evaluated."""
    from ncdlr.service.run_data import DatasetSummary, save_summary
    from ncdlr.service.trained_run import image_input, image_model, table_model

    cfg = Config()
    cfg.data.features, cfg.data.image_size = str(tmp_path / "missing-cache"), 32
    cfg.model.encoder, cfg.model.trainable_blocks, cfg.model.head, cfg.model.cached_blocks = "tiny_cnn", 1, "linear", 1
    run = tmp_path / "run"
    run.mkdir()
    save_config(cfg, run / "config.yaml")
    save_summary(DatasetSummary(KS, KU, 0, 10, [f"c{k}" for k in range(KS + KU)], [5] * (KS + KU)), run)
    torch.manual_seed(5)
    model = build_model(cfg.model, KS, KU, image_size=32)
    with torch.no_grad():
        for p in model.head.parameters():
            p.normal_(0, 3.0)
    save_state(run / "checkpoint", local_state(cfg, model, 1), buffer=None, rng=[rng_state()], config=cfg.to_dict())
    (run / "checkpoint.txt").write_text(str(run / "checkpoint") + "\n")

    trained = open_run(run)
    assert image_input(trained).image_size == 32
    images = torch.randn(6, 3, 32, 32)
    on_cache, on_images = table_model(trained), image_model(trained)
    with torch.no_grad():
        expected = on_cache.logits(on_cache(on_cache.encoder.stem(images, 1)))
        got = on_images.logits(on_images(images))
    torch.testing.assert_close(got, expected)
