"""CIFAR100-LT builder: exact exponential tails per half, the full test set, lossless PNGs, bad pickles."""

from __future__ import annotations

import io
import pickle
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from ncdlr.data.builders import cifar100
from ncdlr.data.builders.common import Plan, SourceFormatError
from ncdlr.data.longtail import long_tail_counts, split_known_novel
from tests.fixtures.datasets import CIFAR_TEST_PER_CLASS, copy_tree, prepared_rows

CONFIG = dict(n_max=20, known_ratio=5.0, novel_ratio=10.0)


@pytest.fixture(scope="module")
def plan(cifar100_root: Path) -> Plan:
    return cifar100.plan(cifar100.Cifar100LTConfig(root=cifar100_root, **CONFIG))


def test_training_counts_follow_the_long_tail_formula_exactly(plan: Plan) -> None:
    counts = [c.train_count for c in plan.classes]
    assert counts == long_tail_counts(20, 50, 5.0) + long_tail_counts(20, 50, 10.0)
    assert Counter(r.label for r in plan.rows if r.split in ("known", "novel")) == dict(enumerate(counts))
    assert plan.info.imbalance == {"known": 5.0, "novel": 10.0}
    assert plan.info.extra["short_classes"] == {}


def test_classes_follow_split_known_novel_and_test_is_the_whole_test_set(cifar100_root: Path) -> None:
    plan = cifar100.plan(cifar100.Cifar100LTConfig(root=cifar100_root, seed=2, **CONFIG))
    known, novel = split_known_novel(100, 2)
    assert [c.name for c in plan.classes] == [f"fine_{i:02d}" for i in known + novel]
    assert [c.group for c in plan.classes] == ["known"] * 50 + ["novel"] * 50
    assert Counter(r.label for r in plan.rows if r.split == "test") == {k: CIFAR_TEST_PER_CLASS for k in range(100)}


def test_stored_png_decodes_to_the_source_pixels(cifar100_root: Path, plan: Plan) -> None:
    pixels, labels = cifar100.read_split(cifar100_root / "cifar-100-python" / "train", 100)
    row = next(r for r in plan.rows if r.split == "known")
    index = int(row.source_id.split("/")[1])
    decoded = np.asarray(Image.open(io.BytesIO(row.image)))
    assert np.array_equal(decoded, pixels[index])
    assert plan.classes[row.label].name == f"fine_{labels[index]:02d}"


def test_subsample_is_seeded_and_deterministic(cifar100_root: Path, plan: Plan) -> None:
    def ids(seed: int) -> set[str]:
        other = cifar100.plan(cifar100.Cifar100LTConfig(root=cifar100_root, seed=seed, **CONFIG))
        return {r.source_id for r in other.rows}

    assert ids(0) == {r.source_id for r in plan.rows}
    assert ids(1) != {r.source_id for r in plan.rows}


def test_build_writes_exact_counts(cifar100_root: Path, tmp_path: Path) -> None:
    manifest = cifar100.build(cifar100.Cifar100LTConfig(root=cifar100_root, **CONFIG), str(tmp_path / "out"),
                              progress=False)
    assert manifest.name == "cifar100-lt-5-10"
    assert manifest.split_counts == {"known": sum(long_tail_counts(20, 50, 5.0)),
                                     "novel": sum(long_tail_counts(20, 50, 10.0)), "test": 200}
    rows = prepared_rows(tmp_path / "out")
    assert len(rows) == manifest.num_rows and all(r["image"].startswith(b"\x89PNG") for r in rows)


def test_paper_sizes_at_full_scale() -> None:
    # CIFAR100-50-50 of the paper: 6.4k known; novel 6.4k (R=50) / 5.5k (R=100), n_max = 500.
    assert sum(long_tail_counts(500, 50, 50)) == 6369
    assert sum(long_tail_counts(500, 50, 100)) == 5499


def test_fewer_images_than_the_head_needs_is_reported(cifar100_root: Path) -> None:
    plan = cifar100.plan(cifar100.Cifar100LTConfig(root=cifar100_root, n_max=25, known_ratio=5, novel_ratio=5))
    assert plan.classes[0].train_count == 20  # only 20 per class in the fixture
    assert plan.info.extra["short_classes"][plan.classes[0].name] == [25, 20]


# ------------------------------------------------------------------------------------------ bad input

def test_label_outside_the_class_list_is_an_error(cifar100_root: Path, tmp_path: Path) -> None:
    root = copy_tree(cifar100_root, tmp_path / "src")
    path = root / "cifar-100-python" / "train"
    data = pickle.loads(path.read_bytes(), encoding="bytes")
    data[b"fine_labels"][3] = 100
    path.write_bytes(pickle.dumps(data, protocol=2))
    with pytest.raises(SourceFormatError, match="fine label 100 outside 0..99"):
        cifar100.plan(cifar100.Cifar100LTConfig(root=root, **CONFIG))


def test_pickle_with_foreign_globals_is_refused(cifar100_root: Path, tmp_path: Path) -> None:
    root = copy_tree(cifar100_root, tmp_path / "src")
    (root / "cifar-100-python" / "meta").write_bytes(pickle.dumps({b"fine_label_names": Path("x")}))
    with pytest.raises(SourceFormatError, match="not allowed"):
        cifar100.plan(cifar100.Cifar100LTConfig(root=root, **CONFIG))


def test_missing_release_file_is_an_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(SourceFormatError, match=r"cifar-100-python/meta does not exist"):
        cifar100.plan(cifar100.Cifar100LTConfig(root=tmp_path, **CONFIG))


def test_wrong_data_shape_is_an_error(cifar100_root: Path, tmp_path: Path) -> None:
    root = copy_tree(cifar100_root, tmp_path / "src")
    path = root / "cifar-100-python" / "test"
    data = pickle.loads(path.read_bytes(), encoding="bytes")
    data[b"data"] = data[b"data"][:, :100]
    path.write_bytes(pickle.dumps(data, protocol=2))
    with pytest.raises(SourceFormatError, match=r"test: 'data' must be uint8 \[N, 3072\]"):
        cifar100.plan(cifar100.Cifar100LTConfig(root=root, **CONFIG))
