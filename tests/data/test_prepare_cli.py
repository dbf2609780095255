"""``ncdlr prepare``: help texts for every dataset, a real build through the CLI, named errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from ncdlr.cli import main
from ncdlr.data.manifest import read_manifest
from tests.fixtures.datasets import INAT_CATEGORIES

DATASETS = ("inat18", "herbarium19", "cifar100-lt", "imagenet100-lt", "fashion-mnist", "openclipart", "emoji",
            "tabler", "phosphor", "mdi", "synthetic")


def test_prepare_help_lists_every_dataset(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["prepare", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert all(name in out for name in DATASETS)


@pytest.mark.parametrize("dataset", DATASETS)
def test_each_dataset_help_explains_its_options(dataset: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["prepare", dataset, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for option in ("--out", "--seed", "--overwrite", "--endpoint-url", "--shard-mb", "--no-progress"):
        assert option in out
    assert "default" in out and "Recommended" in out


def test_synthetic_through_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "ds")
    args = ["prepare", "synthetic", "--classes", "4", "--ratio", "2", "--n-max", "4", "--test-per-class", "1",
            "--image-size", "16", "--out", out, "--no-progress"]
    assert main(args) == 0
    assert "prepared synthetic-4" in capsys.readouterr().out
    assert read_manifest(out).train_counts == [4, 2, 4, 2]
    assert main(args) == 2, "an existing dataset is not replaced without --overwrite"
    assert "a prepared dataset exists" in capsys.readouterr().err
    assert main([*args, "--overwrite"]) == 0


def test_inat18_through_the_cli(inat_root: Path, tmp_path: Path) -> None:
    out = str(tmp_path / "ds")
    assert main(["prepare", "inat18", "--root", str(inat_root), "--classes", "10", "--out", out, "--no-progress"]) == 0
    manifest = read_manifest(out)
    assert manifest.num_classes == 10 and manifest.extra["source_categories"] == INAT_CATEGORIES


def test_bad_source_is_a_clean_error_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "no-such-release"
    code = main(["prepare", "inat18", "--root", str(missing), "--classes", "10", "--out", str(tmp_path / "o")])
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("ncdlr prepare inat18: error:") and str(missing) in err
    assert not (tmp_path / "o" / "manifest.json").exists()


def test_missing_required_option_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["prepare", "inat18", "--root", "x", "--out", "y"])
    assert exit_info.value.code == 2
    assert "--classes" in capsys.readouterr().err


def test_jpeg_quality_without_jpeg_is_a_clean_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A quality the PNG encoder would silently ignore is refused before anything is read or written."""
    out = tmp_path / "o"
    code = main(["prepare", "openclipart", "--root", str(tmp_path), "--jpeg-quality", "70", "--out", str(out)])
    assert code != 0 and not out.exists()
    assert "--jpeg-quality 70 applies to --format jpeg only" in capsys.readouterr().err
