"""What a person reads during a run: the driver's relay of rank 0's lines (no Ray needed for these)."""

from __future__ import annotations

from ncdlr.service.console import ConsoleRelay, progress_bar


def test_epoch_lines_are_printed_and_logged_progress_lines_only_now_and_then_in_a_log(tmp_path, capsys):
    relay = ConsoleRelay("unused", log_file=tmp_path / "train.log")
    relay.log_progress_s = 3600.0  # stdout is not a terminal here: a progress line at most once an hour
    relay.show("progress", "[ncdlr] epoch 1/2 [#...] step 1/10")
    relay.show("line", "[ncdlr] epoch 1/2 done in 1.0s")
    relay.log_progress_s = 0.0
    relay.show("progress", "[ncdlr] epoch 2/2 [##..] step 5/10")
    out = capsys.readouterr().out.splitlines()
    assert out == ["[ncdlr] epoch 1/2 done in 1.0s", "[ncdlr] epoch 2/2 [##..] step 5/10"]
    assert (tmp_path / "train.log").read_text().splitlines() == [
        "[ncdlr] epoch 1/2 [#...] step 1/10", "[ncdlr] epoch 1/2 done in 1.0s", "[ncdlr] epoch 2/2 [##..] step 5/10"]


def test_progress_bar_fills_with_the_steps_done():
    assert progress_bar(0, 10, width=10) == "[..........]"
    assert progress_bar(5, 10, width=10) == "[#####.....]"
    assert progress_bar(12, 10, width=10) == "[##########]"
