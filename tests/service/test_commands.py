"""`ncdlr train` / `ncdlr evaluate` refuse bad input before any Ray work, naming what is wrong."""

import pytest

from ncdlr.cli import main


def test_train_refuses_an_ill_typed_override(capsys):
    assert main(["train", "--features", "x.parquet", "--epochs", "ten"]) == 2
    assert "optim.epochs" in capsys.readouterr().err


def test_train_refuses_an_unknown_flag(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--gama", "5"])
    assert "--gama" in capsys.readouterr().err


def test_evaluate_names_a_directory_that_is_not_a_run(tmp_path, capsys):
    assert main(["evaluate", str(tmp_path)]) == 1
    assert "config.yaml" in capsys.readouterr().err
