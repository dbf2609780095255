"""Names of novel clusters (RUN/names.yaml) and the `ncdlr name` command."""

from __future__ import annotations

import pytest
import yaml

from ncdlr.service.names import NamesError, display_names, novel_key, read_names, update_names
from tests.fixtures.tiny_runs import TINY_KU, make_run_dir


def test_novel_clusters_are_named_novel_nn_until_a_user_names_them(tmp_path):
    assert display_names(["a", "b", "t0", "t1"], 2, 3, {}) == ["a", "b", "novel-00", "novel-01", "novel-02"]
    assert display_names(["a", "b"], 2, 2, {1: "barn owl"}) == ["a", "b", "novel-00", "barn owl"]
    assert novel_key(7) == "novel-07"


def test_update_names_sets_unsets_and_survives_a_reread(tmp_path):
    update_names(tmp_path, 10, {"novel-07": "barn owl", "novel-02": "tulip"})
    assert read_names(tmp_path, 10) == {7: "barn owl", 2: "tulip"}
    assert update_names(tmp_path, 10, remove=["novel-02"]) == {7: "barn owl"}
    assert yaml.safe_load((tmp_path / "names.yaml").read_text()) == {"novel-07": "barn owl"}


@pytest.mark.parametrize("key, match", [("class_3", "not a novel cluster's key"), ("novel-10", "has 10 novel clusters"),
                                        ("novel-x", "not a novel cluster's key")])
def test_a_key_that_is_not_a_novel_cluster_of_the_run_is_refused_and_nothing_written(tmp_path, key, match):
    with pytest.raises(NamesError, match=match):
        update_names(tmp_path, 10, {key: "owl"})
    assert not (tmp_path / "names.yaml").exists()


def test_an_empty_name_or_a_broken_names_file_is_refused(tmp_path):
    with pytest.raises(NamesError, match="empty"):
        update_names(tmp_path, 4, {"novel-01": "  "})
    (tmp_path / "names.yaml").write_text("novel-01: [unclosed\n")
    with pytest.raises(NamesError, match="not valid YAML"):
        read_names(tmp_path, 4)
    (tmp_path / "names.yaml").write_text("- a list\n")
    with pytest.raises(NamesError, match="must map"):
        read_names(tmp_path, 4)


def test_the_name_command_writes_and_lists_names(tmp_path, capsys):
    from ncdlr.cli import main

    run, _ = make_run_dir(tmp_path)
    assert main(["name", str(run), "--set", 'novel-03="barn owl"', "--set", "novel-00=fern"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[:TINY_KU] == ["novel-00  fern", "novel-01", "novel-02", "novel-03  barn owl", "novel-04"]
    assert read_names(run, TINY_KU) == {0: "fern", 3: "barn owl"}
    assert main(["name", str(run), "--set", "class_1=owl"]) == 2
    assert "not a novel cluster" in capsys.readouterr().err


def test_set_aside_names_keeps_the_old_names_out_of_a_retrained_run(tmp_path):
    from ncdlr.service.names import PREVIOUS_NAMES_FILE, set_aside_names

    assert set_aside_names(tmp_path) is None
    update_names(tmp_path, 4, {"novel-01": "owl"})
    assert set_aside_names(tmp_path) == tmp_path / PREVIOUS_NAMES_FILE
    assert read_names(tmp_path, 4) == {}  # the new clusters start unnamed
    assert yaml.safe_load((tmp_path / PREVIOUS_NAMES_FILE).read_text()) == {"novel-01": "owl"}  # nothing lost
