"""``ncdlr gallery`` end to end: a run's page built from real predictions, opened in a real headless Chromium.

The run is test_predict's tiny_cnn run on a prepared JPEG dataset (random weights; see that module). The browser
check skips, naming why, where no Chromium is installed (`make test` installs one where it can).
"""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from ncdlr.data.predictions import read_predictions
from ncdlr.service.evaluate import evaluate_run
from ncdlr.service.gallery import build_gallery, nearest_known
from ncdlr.service.names import update_names
from tests.service.browser import read_gallery, require_browser
from tests.service.test_predict import KS, KU, NEW_IMAGES, put_files, write_image_run


@pytest.fixture(scope="module")
def gallery_run(tmp_path_factory, ray_local):
    run = write_image_run(tmp_path_factory.mktemp("gallery-run"), seed=2)
    evaluate_run(run)
    update_names(run, KU, {"novel-01": '<script>alert("x")</script> & owl'})
    page = build_gallery(str(run), str(run / "gallery"), progress=False)
    return run, page


def test_nearest_known_ranks_by_mean_cosine_and_leaves_out_the_class_itself():
    assert nearest_known(np.array([0.1, 0.7, 0.4]), ["a", "b", "c"], exclude=None, top=2) == (("b", 0.7), ("c", 0.4))
    assert [n for n, _ in nearest_known(np.array([0.1, 0.7, 0.4]), ["a", "b", "c"], exclude=1)] == ["c", "a"]


def test_the_gallery_shows_every_class_with_the_numbers_of_the_predictions(gallery_run):
    require_browser()
    run, page = gallery_run
    shown = read_gallery(page)
    assert shown["broken_images"] == [] and shown["image_count"] > 0
    table = read_predictions(str(run / "gallery" / "predictions"))[0].to_pandas()
    novel_train = read_predictions(str(run / "novel-predictions"))[0].to_pandas()
    sections = {s["index"]: s for s in shown["sections"]}
    assert sorted([*sections, *shown["empty"]]) == list(range(KS + KU))  # every class listed, none hidden
    counts, pseudo = Counter(table.pred), Counter(novel_train.pred)
    for index, section in sections.items():
        assert section["predicted_count"] == counts.get(index, 0)
        assert section["train_count"] == (pseudo.get(index, 0) if index >= KS else [14, 8][index])
        assert len(section["images"]) <= 11 and {i["alt"] for i in section["images"]} <= set(table.source_id)
    order = [s["index"] for s in shown["sections"]]
    novel = [i for i in order if i >= KS]
    assert order[:len(novel)] == novel  # novel first
    assert [sections[i]["train_count"] for i in novel] == sorted((sections[i]["train_count"] for i in novel),
                                                                 reverse=True)
    metrics = json.loads((run / "metrics.json").read_text())
    assert shown["metrics"] == {k: metrics[k] for k in ("all", "known", "novel")}
    assert sections.get(KS + 1, {"name": '<script>alert("x")</script> & owl'})["name"] == \
        '<script>alert("x")</script> & owl'  # a user's name shown as text, not run


def test_the_gallery_gives_each_clusters_matched_and_majority_true_class_and_purity(gallery_run):
    require_browser()
    from ncdlr.metrics import hungarian_mapping
    from ncdlr.service.trained_run import open_run

    run, page = gallery_run
    table = read_predictions(str(run / "gallery" / "predictions"))[0].to_pandas()
    mapping = hungarian_mapping(table.label.to_numpy(), table.pred.to_numpy())
    names = open_run(run).class_names
    checked = 0
    for section in read_gallery(page)["sections"]:
        rows = table[table.pred == section["index"]]
        matched = mapping.get(section["index"]) if len(rows) else None
        assert section["matched"] == (names[matched] if matched is not None else None)
        if len(rows):
            counts = np.bincount(rows.label.astype(int))  # ties: the smaller class id
            assert section["majority"] == names[int(counts.argmax())]
            assert section["purity"] == pytest.approx(counts.max() / len(rows))
            checked += 1
    assert checked >= 2
    assert "<script>alert" not in page.read_text()


def test_a_gallery_of_a_folder_of_new_images_shows_their_thumbnails(gallery_run, tmp_path):
    require_browser()
    from ncdlr.service.predict import predict_run

    run, _ = gallery_run
    put_files(str(tmp_path / "new"), NEW_IMAGES)
    predict_run(str(run), str(tmp_path / "new"), str(tmp_path / "pred"), embeddings=True, progress=False)
    page = build_gallery(str(run), str(tmp_path / "gallery"), predictions=str(tmp_path / "pred"), progress=False)
    shown = read_gallery(page)
    assert shown["broken_images"] == []
    assert sorted(i["alt"] for s in shown["sections"] for i in s["images"]) == \
        ["a.jpg", "b/tall.webp", "b/wide.png", "c/big.JPEG"]  # the corrupt file has no row, so no thumbnail
    assert all(s["matched"] is None and s["majority"] is None and s["purity"] is None
               for s in shown["sections"])  # no ground truth here


def test_gallery_refuses_predictions_of_another_run(gallery_run, tmp_path):
    from ncdlr.service.config import ConfigError
    from tests.fixtures.tiny_runs import make_run_dir

    run, _ = gallery_run
    other, _ = make_run_dir(tmp_path)
    with pytest.raises(ConfigError, match="classes, but run"):
        build_gallery(str(other), str(tmp_path / "g"), predictions=str(run / "gallery" / "predictions"))


def test_a_gallery_rebuilt_after_retraining_replaces_its_own_stale_predictions(tmp_path, ray_local):
    import shutil

    from ncdlr.data.predictions import read_metadata

    run = write_image_run(tmp_path, seed=3)
    build_gallery(str(run), str(run / "gallery"), progress=False)
    shutil.copytree(run / "checkpoint", run / "checkpoint-2")  # the run trained again: a new last checkpoint
    (run / "checkpoint.txt").write_text(str(run / "checkpoint-2") + "\n")
    build_gallery(str(run), str(run / "gallery"), progress=False)
    for folder in (run / "gallery" / "predictions", run / "novel-predictions"):
        assert read_metadata(str(folder))["checkpoint"] == str(run / "checkpoint-2")


def test_once_a_run_has_its_novel_predictions_a_gallery_of_new_images_needs_no_training_data(tmp_path, ray_local):
    import shutil

    from ncdlr.service.config import load_yaml
    from ncdlr.service.predict import predict_run
    from ncdlr.service.run_data import load_training_data, save_summary

    run = write_image_run(tmp_path, seed=5)
    save_summary(load_training_data(load_yaml(run / "config.yaml").data).summary, run)  # as `ncdlr train` does
    build_gallery(str(run), str(run / "gallery"), progress=False)  # makes RUN/novel-predictions
    shutil.rmtree(tmp_path / "data")  # e.g. the demo's S3 server has stopped
    put_files(str(tmp_path / "new"), NEW_IMAGES)
    predict_run(str(run), str(tmp_path / "new"), str(tmp_path / "pred"), embeddings=True, progress=False)
    page = build_gallery(str(run), str(tmp_path / "g"), predictions=str(tmp_path / "pred"), progress=False)
    assert page.is_file() and len(list((tmp_path / "g" / "thumbs").iterdir())) == 4
