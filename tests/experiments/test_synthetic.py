"""The synthetic discovery experiment (the first main job) runs end to end and learns."""

import json

from ncdlr.experiments.synthetic import Setting, main, make_data, train_and_evaluate


def test_data_follow_the_long_tail_and_the_test_split_is_balanced():
    setting = Setting()
    known, novel, test, counts = make_data(setting, seed=0)
    assert counts[0] == 250 and counts[19] == 5 and counts[20] == 250 and counts[39] == 5
    assert len(known.y) == sum(counts[:20]) and len(novel.y) == sum(counts[20:])
    assert int(known.y.max()) < 20 <= int(novel.y.min())
    assert (test.y.bincount() == setting.test_per_class).all()


def test_ncdlr_discovers_novel_classes_far_above_chance_on_a_short_budget():
    result = train_and_evaluate("ncdlr", Setting(epochs=15), seed=0)
    assert result["novel"] > 0.35  # 20 novel classes: Hungarian-matched chance is ≈ 0.1
    assert result["known"] > 0.5


def test_cli_writes_the_table_and_json(tmp_path, capsys):
    assert main(["--seeds", "1", "--epochs", "1", "--methods", "uno", "ncdlr", "--out", str(tmp_path)]) == 0
    saved = json.loads((tmp_path / "results.json").read_text())
    assert set(saved["results"]) == {"uno", "ncdlr"}
    assert "| ncdlr |" in (tmp_path / "results.md").read_text()
    assert "class-mean accuracy" in capsys.readouterr().out
