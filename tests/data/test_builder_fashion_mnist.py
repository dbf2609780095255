"""Fashion-MNIST-LT builder: exact exponential tails per half, the full test set, lossless PNGs, bad IDX files."""

from __future__ import annotations

import gzip
import io
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from ncdlr.cli import main
from ncdlr.data.builders import fashion_mnist
from ncdlr.data.builders.common import Plan, SourceFormatError
from ncdlr.data.longtail import long_tail_counts, split_known_novel
from ncdlr.data.manifest import read_manifest
from tests.fixtures.datasets import (
    FASHION_TEST_PER_CLASS,
    FASHION_TRAIN_PER_CLASS,
    copy_tree,
    idx_bytes,
    prepared_rows,
    write_fashion_mnist,
)

CONFIG = dict(n_max=10, known_ratio=5.0, novel_ratio=10.0)


@pytest.fixture(scope="module")
def plan(fashion_mnist_root: Path) -> Plan:
    return fashion_mnist.plan(fashion_mnist.FashionMnistLTConfig(root=fashion_mnist_root, **CONFIG), progress=False)


def test_training_counts_follow_the_long_tail_formula_exactly(plan: Plan) -> None:
    counts = [c.train_count for c in plan.classes]
    assert counts == long_tail_counts(10, 5, 5.0) + long_tail_counts(10, 5, 10.0)
    assert Counter(r.label for r in plan.rows if r.split in ("known", "novel")) == dict(enumerate(counts))
    assert plan.info.imbalance == {"known": 5.0, "novel": 10.0}
    assert plan.info.extra["short_classes"] == {}


def test_classes_follow_split_known_novel_and_test_is_the_whole_test_set(fashion_mnist_root: Path) -> None:
    plan = fashion_mnist.plan(fashion_mnist.FashionMnistLTConfig(root=fashion_mnist_root, seed=3, **CONFIG),
                              progress=False)
    known, novel = split_known_novel(10, 3)
    assert [c.name for c in plan.classes] == [fashion_mnist.CLASS_NAMES[i] for i in known + novel]
    assert [c.group for c in plan.classes] == ["known"] * 5 + ["novel"] * 5
    assert Counter(r.label for r in plan.rows if r.split == "test") == {k: FASHION_TEST_PER_CLASS for k in range(10)}


def test_stored_png_decodes_to_the_source_pixels(fashion_mnist_root: Path, plan: Plan) -> None:
    pixels, labels = fashion_mnist.read_split(fashion_mnist_root, "train")
    for row in [r for r in plan.rows if r.split != "test"][:5]:
        index = int(row.source_id.split("/")[1])
        assert np.array_equal(np.asarray(Image.open(io.BytesIO(row.image))), pixels[index])
        assert row.class_name == fashion_mnist.CLASS_NAMES[labels[index]]


def test_raw_idx_files_read_as_the_gzipped_ones(fashion_mnist_root: Path, tmp_path: Path) -> None:
    raw = write_fashion_mnist(tmp_path / "raw", gz=False)
    for split in ("train", "test"):
        for a, b in zip(fashion_mnist.read_split(raw, split), fashion_mnist.read_split(fashion_mnist_root, split)):
            assert np.array_equal(a, b)


def test_subsample_is_seeded_and_deterministic(fashion_mnist_root: Path, plan: Plan) -> None:
    def ids(seed: int) -> set[str]:
        other = fashion_mnist.plan(fashion_mnist.FashionMnistLTConfig(root=fashion_mnist_root, seed=seed, **CONFIG),
                                   progress=False)
        return {r.source_id for r in other.rows if r.split != "test"}

    assert ids(0) == {r.source_id for r in plan.rows if r.split != "test"}
    assert ids(1) != ids(0)


def test_fewer_images_than_the_head_needs_is_reported(fashion_mnist_root: Path) -> None:
    plan = fashion_mnist.plan(fashion_mnist.FashionMnistLTConfig(root=fashion_mnist_root, n_max=15), progress=False)
    assert plan.classes[0].train_count == FASHION_TRAIN_PER_CLASS
    assert plan.info.extra["short_classes"][plan.classes[0].name] == [15, FASHION_TRAIN_PER_CLASS]


def test_through_the_cli_writes_exact_counts(fashion_mnist_root: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "ds")
    assert main(["prepare", "fashion-mnist", "--root", str(fashion_mnist_root), "--n-max", "10", "--known-ratio", "5",
                 "--novel-ratio", "10", "--out", out, "--no-progress"]) == 0
    assert "prepared fashion-mnist-lt-5-10" in capsys.readouterr().out
    manifest = read_manifest(out)
    assert manifest.split_counts == {"known": sum(long_tail_counts(10, 5, 5.0)),
                                     "novel": sum(long_tail_counts(10, 5, 10.0)), "test": 10 * FASHION_TEST_PER_CLASS}
    rows = prepared_rows(Path(out))
    assert len(rows) == manifest.num_rows and all(r["image"].startswith(b"\x89PNG") for r in rows)


# ------------------------------------------------------------------------------------------ bad input

def _rewrite(root: Path, name: str, data: bytes) -> None:
    (root / f"{name}.gz").write_bytes(gzip.compress(data))


def test_missing_release_file_is_an_error_naming_it_and_the_package(tmp_path: Path) -> None:
    with pytest.raises(SourceFormatError, match=r"train-images-idx3-ubyte\[\.gz\] does not exist.*dataset-fashion-mnist"):
        fashion_mnist.plan(fashion_mnist.FashionMnistLTConfig(root=tmp_path), progress=False)


def test_label_outside_the_class_list_is_an_error(fashion_mnist_root: Path, tmp_path: Path) -> None:
    root = copy_tree(fashion_mnist_root, tmp_path / "src")
    labels = np.zeros(10 * FASHION_TEST_PER_CLASS, dtype=np.uint8)
    labels[4] = 10
    _rewrite(root, "t10k-labels-idx1-ubyte", idx_bytes(labels))
    with pytest.raises(SourceFormatError, match=r"t10k-labels-idx1-ubyte.gz: label 10 outside 0..9"):
        fashion_mnist.plan(fashion_mnist.FashionMnistLTConfig(root=root), progress=False)


def test_label_count_not_matching_the_images_is_an_error(fashion_mnist_root: Path, tmp_path: Path) -> None:
    root = copy_tree(fashion_mnist_root, tmp_path / "src")
    _rewrite(root, "train-labels-idx1-ubyte", idx_bytes(np.zeros(7, dtype=np.uint8)))
    with pytest.raises(SourceFormatError, match=r"7 labels for the 120 images"):
        fashion_mnist.plan(fashion_mnist.FashionMnistLTConfig(root=root), progress=False)


def test_wrong_magic_is_an_error(fashion_mnist_root: Path, tmp_path: Path) -> None:
    root = copy_tree(fashion_mnist_root, tmp_path / "src")
    # a labels file where the images should be: 1-d magic 0x801 instead of 0x803
    _rewrite(root, "train-images-idx3-ubyte", idx_bytes(np.zeros(5, dtype=np.uint8)))
    with pytest.raises(SourceFormatError, match=r"IDX magic 0x00000801, expected 0x00000803"):
        fashion_mnist.plan(fashion_mnist.FashionMnistLTConfig(root=root), progress=False)


def test_truncated_payload_is_an_error(fashion_mnist_root: Path, tmp_path: Path) -> None:
    root = copy_tree(fashion_mnist_root, tmp_path / "src")
    data = idx_bytes(np.zeros((4, 28, 28), dtype=np.uint8))
    _rewrite(root, "t10k-images-idx3-ubyte", data[:-100])
    with pytest.raises(SourceFormatError, match=r"header says \(4, 28, 28\) = 3136 bytes, the file holds 3036"):
        fashion_mnist.plan(fashion_mnist.FashionMnistLTConfig(root=root), progress=False)


def test_cut_off_gzip_is_an_error(fashion_mnist_root: Path, tmp_path: Path) -> None:
    root = copy_tree(fashion_mnist_root, tmp_path / "src")
    path = root / "train-images-idx3-ubyte.gz"
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(SourceFormatError, match=r"train-images-idx3-ubyte.gz: cannot read"):
        fashion_mnist.plan(fashion_mnist.FashionMnistLTConfig(root=root), progress=False)


def test_wrong_image_side_is_an_error(fashion_mnist_root: Path, tmp_path: Path) -> None:
    root = copy_tree(fashion_mnist_root, tmp_path / "src")
    _rewrite(root, "t10k-images-idx3-ubyte", idx_bytes(np.zeros((30, 32, 32), dtype=np.uint8)))
    with pytest.raises(SourceFormatError, match=r"images are 32×32, expected 28×28"):
        fashion_mnist.plan(fashion_mnist.FashionMnistLTConfig(root=root), progress=False)


def test_bad_source_through_the_cli_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["prepare", "fashion-mnist", "--root", str(tmp_path / "none"), "--out", str(tmp_path / "o")])
    assert code == 2
    assert capsys.readouterr().err.startswith("ncdlr prepare fashion-mnist: error:")
    assert not (tmp_path / "o").exists()
