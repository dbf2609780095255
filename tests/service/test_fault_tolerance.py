"""Failures on a real local Ray (slow): a killed buffer actor is survived, and ``checkpoint.txt`` is written.

The buffer actor is killed from the driver once the run's first checkpoint exists (``ray.kill(actor,
no_restart=False)``, as a crashed actor process): Ray restarts it empty, rank 0's next push or flush fails,
and with ``run.max_failures 1`` Ray Train restarts the worker group from the last checkpoint, whose buffer
rank 0 writes back into the actor. Feature-table runs are deterministic (batches seeded per epoch, RNG, τ's
SGD state and the buffer all in the checkpoint), so the restarted run must end exactly where an
uninterrupted one ends. With ``max_failures 0`` the run fails, yet ``checkpoint.txt`` names its last
checkpoint, and ``--run.resume`` from it finishes the run — again exactly as the uninterrupted one.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from ncdlr.service.checkpoint import load_checkpoint
from tests.fixtures.tiny_runs import tiny_config, write_tiny_table

pytestmark = pytest.mark.slow
EPOCHS = 4


def run_config(table: str, output: Path, **run):
    """4 epochs of a tiny table at batch 8 (≈ 40 steps an epoch: long enough to kill the actor mid-run)."""
    cfg = tiny_config(table, output, labeler={"gamma": 5.0},
                      run={"num_workers": 1, "cpus_per_worker": 1.0, "checkpoint_every_s": 0.0, **run})
    cfg.data.batch_size, cfg.optim.epochs, cfg.optim.warmup_epochs = 8, EPOCHS, 1
    return cfg


def checkpoints(output: Path) -> list[Path]:
    """The run's checkpoint directories in the default run storage ``<output>/ray/<run name>/``, oldest first."""
    return sorted((path for path in output.glob("ray/*/checkpoint_*") if path.is_dir()), key=lambda path: path.name)


class ActorKiller(threading.Thread):
    """Kills the run's buffer actor (Ray may restart it) once ``output`` holds its first checkpoint."""

    def __init__(self, output: Path, timeout_s: float = 300.0):
        super().__init__(daemon=True)
        self.output, self.timeout_s = output, timeout_s
        self.killed_after: int | None = None  # checkpoints that existed at the kill
        self.killed_at: float | None = None  # time.perf_counter() of the kill

    def run(self) -> None:
        import ray

        deadline = time.monotonic() + self.timeout_s
        while not checkpoints(self.output) and time.monotonic() < deadline:
            time.sleep(0.02)
        names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                 if a["namespace"] == "ncdlr" and a["name"].startswith("buffer-")]
        if len(names) == 1 and checkpoints(self.output):
            self.killed_after = len(checkpoints(self.output))
            ray.kill(ray.get_actor(names[0], namespace="ncdlr"), no_restart=False)
            self.killed_at = time.perf_counter()


@pytest.fixture(scope="module")
def table(tmp_path_factory) -> str:
    return write_tiny_table(tmp_path_factory.mktemp("table") / "features.parquet", n_max=120)


@pytest.fixture(scope="module")
def uninterrupted(ray_local, table, tmp_path_factory) -> dict:
    from ncdlr.service.trainer import fit

    return fit(run_config(table, tmp_path_factory.mktemp("uninterrupted") / "run"))


def test_a_killed_buffer_actor_is_restored_and_the_run_ends_as_an_uninterrupted_one(ray_local, table, uninterrupted,
                                                                                     tmp_path):
    from ncdlr.service.trainer import fit

    output = tmp_path / "run"
    killer = ActorKiller(output)
    killer.start()
    result = fit(run_config(table, output, max_failures=1))
    killer.join(timeout=5)
    assert killer.killed_after is not None and killer.killed_after < EPOCHS, "the actor was not killed mid-run"
    assert "resuming after epoch" in (output / "train.log").read_text()  # the worker group was restarted
    # each checkpoint after the restart compared the restored actor with rank 0's replica (worker.checkpoint_and_report)
    assert result["metrics"]["epoch"] == EPOCHS
    named = (output / "checkpoint.txt").read_text().strip()
    assert named == result["checkpoint"] == str(checkpoints(output)[-1])
    final, reference = load_checkpoint(named), load_checkpoint(uninterrupted["checkpoint"])
    assert final["step"] == reference["step"] and final["tau_history"] == pytest.approx(reference["tau_history"])
    for key in ("all", "known", "novel"):  # exact resume: the same run, not just a similar one
        assert result["test"][key] == pytest.approx(uninterrupted["test"][key], abs=1e-6), key


def test_a_failed_run_names_its_last_checkpoint_and_resumes_from_it(ray_local, table, uninterrupted, tmp_path):
    from ncdlr.service.trainer import fit

    output = tmp_path / "failed"
    killer = ActorKiller(output)
    killer.start()
    with pytest.raises(Exception):  # max_failures 0: the worker group's failure ends the run
        fit(run_config(table, output, max_failures=0))
    killer.join(timeout=5)
    assert killer.killed_after is not None and killer.killed_after < EPOCHS
    named = (output / "checkpoint.txt").read_text().strip()
    assert named == str(checkpoints(output)[-1])
    assert 1 <= load_checkpoint(named)["epoch"] < EPOCHS

    resumed = fit(run_config(table, tmp_path / "resumed", resume=named))
    assert resumed["metrics"]["epoch"] == EPOCHS
    for key in ("all", "known", "novel"):
        assert resumed["test"][key] == pytest.approx(uninterrupted["test"][key], abs=1e-6), key


def test_a_checkpoint_interval_saves_only_the_last_epoch_and_changes_nothing_else(ray_local, table, uninterrupted,
                                                                                    tmp_path):
    """``run.checkpoint_every_s`` longer than the run: every epoch's line, one report and checkpoint (after the last
    epoch), and the same run as checkpointing every epoch (whose checkpoints are uploaded async)."""
    from ncdlr.service.trainer import fit

    output = tmp_path / "run"
    result = fit(run_config(table, output, checkpoint_every_s=3600.0))
    assert [load_checkpoint(path)["epoch"] for path in checkpoints(output)] == [EPOCHS]
    assert [f"epoch {e}/{EPOCHS} done" in (output / "train.log").read_text() for e in range(1, EPOCHS + 1)] == \
        [True] * EPOCHS
    assert len(checkpoints(Path(uninterrupted["output"]))) == 2  # run.checkpoints_to_keep of one per epoch
    for key in ("all", "known", "novel"):
        assert result["test"][key] == pytest.approx(uninterrupted["test"][key], abs=1e-6), key


def test_sigint_ends_the_cli_with_one_line_naming_the_checkpoint_and_exit_130(table, tmp_path):
    """Ctrl-C during ``ncdlr train`` (a real process, its own local Ray): Ray Train's handler aborts the run;
    the CLI writes ``checkpoint.txt``, prints one line naming the last checkpoint and how to resume, exit 130."""
    import os
    import signal
    import subprocess
    import sys

    output = tmp_path / "run"
    cli = [sys.executable, "-m", "ncdlr.cli", "train", "--features", table, "--output", str(output),
           "--batch-size", "8", "--epochs", "200", "--buffer-size", "64", "--run.checkpoint_every_s", "0"]
    proc = subprocess.Popen(cli, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    deadline = time.monotonic() + 300
    while not checkpoints(output) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    if proc.poll() is not None:
        out, err = proc.communicate()
        pytest.fail(f"ncdlr train exited with {proc.returncode} before its first checkpoint:\n{out[-2000:]}\n{err[-4000:]}")
    assert checkpoints(output), "no checkpoint within 300 s"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err[-2000:]
    lines = [line for line in err.splitlines() if line.startswith("ncdlr train:")]
    assert len(lines) == 1 and "interrupted (SIGINT); last checkpoint" in lines[0] and "Traceback" not in err
    named = (output / "checkpoint.txt").read_text().strip()
    assert named in lines[0] and f"--run.resume {named}" in lines[0]
    assert load_checkpoint(named)["epoch"] >= 1
