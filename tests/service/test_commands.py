"""`ncdlr train` / `ncdlr evaluate` refuse bad input before any Ray work, naming what is wrong; the entry points'
flags (`--overwrite`) reach the config."""

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


def test_train_names_a_missing_feature_table_in_one_line(tmp_path, capsys):
    """A user error (here: no such table) is one line and exit code 2, before Ray starts; no traceback."""
    from ncdlr.cli import main

    assert main(["train", "--features", str(tmp_path / "nope.parquet"), "--output", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "nope.parquet" in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()


def test_naming_uno_with_fixed_prototypes_is_refused_before_anything_runs(tmp_path, capsys):
    from ncdlr.cli import main

    assert main(["train", "--method.name", "uno", "--prototypes", "etf", "--output", str(tmp_path / "run")]) == 2
    assert "model.prototypes='learnable'" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("argv, overwrite", [([], False), (["--overwrite"], True), (["--run.overwrite", "true"], True)])
def test_train_overwrite_flag_reaches_the_config(argv, overwrite):
    from ncdlr.cli import build_parser
    from ncdlr.commands.train import build_config

    args = build_parser().parse_args(["train", "--features", "x.parquet", *argv])
    assert build_config(args).run.overwrite is overwrite


def test_train_inat2k_overwrite_flag_reaches_the_config():
    from ncdlr import train_inat2k

    parse = train_inat2k.build_parser().parse_args
    assert train_inat2k.build_config(parse(["--data", "s3://b/x", "--overwrite"])).run.overwrite is True
    assert train_inat2k.build_config(parse(["--data", "s3://b/x"])).run.overwrite is False


@pytest.mark.parametrize("argv, overwrite", [([], True), (["--output", "runs/mine"], False),
                                             (["--run.output", "runs/mine"], False)])
def test_the_embedded_default_replaces_only_its_own_default_directory(argv, overwrite):
    """`make demo` reruns into runs/demo; a directory the user names is protected as for any run."""
    from ncdlr import train_inat2k

    cfg = train_inat2k.build_config(train_inat2k.build_parser().parse_args(argv))
    assert cfg.run.overwrite is overwrite
    assert (cfg.run.output == "runs/demo") is (not argv)
