"""cluster/simulate.py: a real multi-node Ray cluster on this machine, jobs through the Ray Jobs API.

The slow tests start `ray start --block` processes (a head and one worker node, 2 logical CPUs and a
256 MiB object store each) and submit jobs with `JobSubmissionClient`, the path `ray job submit` takes.
"""

import json
import secrets
import shlex
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from ray.exceptions import AuthenticationError
from ray.job_submission import JobSubmissionClient

from ncdlr.data.predictions import read_predictions

from cluster.simulate import (
    MIN_OBJECT_STORE_BYTES,
    NodeSpec,
    SimulatedCluster,
    SimulationError,
    check_metrics,
    main,
    parse_probe,
    probe_entrypoint,
    training_entrypoint,
)

REPO = Path(__file__).resolve().parents[2]
SMALL = NodeSpec(num_cpus=2, object_store_bytes=256 * 1024 * 1024)


# ---------------------------------------------------------------- bad input, no cluster needed
def test_node_spec_rejects_zero_cpus():
    with pytest.raises(ValueError, match="num_cpus"):
        NodeSpec(num_cpus=0)


def test_node_spec_rejects_an_object_store_below_rays_minimum():
    with pytest.raises(ValueError, match="object_store_bytes"):
        NodeSpec(object_store_bytes=MIN_OBJECT_STORE_BYTES - 1)


def test_cluster_needs_a_head():
    with pytest.raises(ValueError, match="at least one NodeSpec"):
        SimulatedCluster([])


def test_missing_ray_cli_is_named(tmp_path):
    missing = tmp_path / "bin" / "ray"
    with pytest.raises(SimulationError, match=str(missing)):
        SimulatedCluster([SMALL], ray_executable=missing)


def test_cli_rejects_negative_worker_nodes(capsys):
    with pytest.raises(SystemExit):
        main(["--probe", "--worker-nodes", "-1"])
    assert "--worker-nodes" in capsys.readouterr().err


def test_check_metrics_names_a_missing_file(tmp_path):
    with pytest.raises(SimulationError, match=str(tmp_path / "metrics.json")):
        check_metrics(tmp_path)


def test_check_metrics_names_a_file_that_is_not_json(tmp_path):
    (tmp_path / "metrics.json").write_text("{all: 0.5")
    with pytest.raises(SimulationError, match="not valid JSON"):
        check_metrics(tmp_path)


def test_check_metrics_names_missing_keys(tmp_path):
    (tmp_path / "metrics.json").write_text(json.dumps({"all": 0.5, "known": 0.6}))
    with pytest.raises(SimulationError, match=r"lacks keys \['novel'\]"):
        check_metrics(tmp_path)


def test_check_metrics_returns_the_metrics(tmp_path):
    (tmp_path / "metrics.json").write_text(json.dumps({"all": 0.5, "known": 0.6, "novel": 0.4, "tau": 3.0}))
    assert check_metrics(tmp_path)["novel"] == 0.4


def test_parse_probe_without_a_probe_line_is_an_error():
    with pytest.raises(SimulationError, match="no PROBE line"):
        parse_probe("Traceback (most recent call last):\n  ...")


def test_entrypoints_quote_paths(tmp_path):
    odd = tmp_path / "run dir"
    assert shlex.split(training_entrypoint(odd, "--epochs 1")) == [
        "python", "-m", "ncdlr.train_inat2k", "--output", str(odd), "--shared-storage", "true", "--epochs", "1"]
    assert shlex.split(probe_entrypoint(3))[-2:] == ["--run-probe", "3"]


# ---------------------------------------------------------------- the real thing
@pytest.mark.slow
def test_jobs_reach_every_node_failures_are_reported_and_stop_leaves_nothing():
    """Token auth on, as cluster/config.yaml starts its nodes: the job and our client carry the token."""
    with SimulatedCluster([SMALL, SMALL], auth_token=secrets.token_hex(16)) as cluster:
        probe = cluster.submit(probe_entrypoint(2), timeout_s=300)
        failing = cluster.submit("python -c 'import sys; print(\"bad input\"); sys.exit(3)'", timeout_s=120)
        for headers in ({}, {"Authorization": "Bearer not-the-token"}):
            with pytest.raises(AuthenticationError):
                JobSubmissionClient(cluster.dashboard_url, headers=headers).list_jobs()
    assert probe.status == "SUCCEEDED", probe.logs
    report = parse_probe(probe.logs)
    assert report["alive_nodes"] == 2
    assert report["cluster_resources"]["CPU"] == 4
    assert report["cluster_resources"]["object_store_memory"] == 2 * SMALL.object_store_bytes
    assert len(set(report["task_nodes"].values())) == 2  # one task ran on each node
    assert failing.status == "FAILED"
    assert "bad input" in failing.logs and "3" in failing.message
    assert cluster.leftover_processes() == []


#: Keeps a training job small enough for 2 shared cores: 4 synthetic classes, 1 epoch, 2 half-CPU workers.
TINY = "--epochs 1 --num-workers 2 --cpus-per-worker 0.5 --use-gpu false"


@pytest.fixture(scope="module")
def two_nodes():
    """One two-node cluster for the training jobs below (each job gets the whole cluster in turn; starting and
    stopping a cluster per job cost ~20 s of the suite). Its stop is checked here: nothing is left running."""
    cluster = SimulatedCluster([SMALL, SMALL])
    with cluster:
        yield cluster
    assert cluster.leftover_processes() == []


@pytest.mark.slow
def test_cluster_job_trains_on_s3_data_across_two_nodes(tmp_path, s3_server, s3_bucket, two_nodes):
    """The production path: `--data s3://…` on a two-node cluster through the Jobs API.

    The job gets the S3 endpoint and credentials the way a real cluster job gets its settings: through the
    job's runtime_env (here the test's rclone server; on AWS the instance profile needs none). Checkpoints
    go to s3:// run storage, as the README's cluster command sends them (a local path is refused on two nodes).
    """
    from ncdlr.data.builders import synthetic

    data, output = f"{s3_bucket}/datasets/synthetic-4", tmp_path / "run"
    synthetic.build(synthetic.SyntheticConfig(num_classes=4, seed=0), data, progress=False)
    entrypoint = (f"python -m ncdlr.train_inat2k --config {shlex.quote(str(REPO / 'configs' / 'demo.yaml'))} "
                  f"--data {data} --output {shlex.quote(str(output))} --storage-path {s3_bucket}/runs {TINY}")
    result = two_nodes.submit(entrypoint, env_vars=s3_server.env(), timeout_s=900)
    assert result.status == "SUCCEEDED", result.logs[-5000:]
    metrics = check_metrics(output)
    assert all(0.0 <= metrics[key] <= 1.0 for key in ("all", "known", "novel"))
    assert "[ncdlr] 2 worker(s) on cpu" in result.logs  # one DDP group of 2 workers, in our own console line
    assert "sizes held at the adaptive prior" in result.logs  # the demo config's labeler, named on that line
    assert (output / "checkpoint.txt").read_text().strip().startswith(f"{s3_bucket}/runs/")


@pytest.mark.slow
def test_embedded_default_job_on_two_nodes_writes_metrics(tmp_path, two_nodes):
    """`python -m ncdlr.train_inat2k` with no --data, submitted as a job: it joins the job's cluster (no
    resource arguments to ray.init) and hands its embedded S3 server's settings to every task and worker
    through the job's runtime_env. Both nodes share this machine, so the server on 127.0.0.1 is reachable."""
    output = tmp_path / "run"
    result = two_nodes.submit(training_entrypoint(output, f"--classes 4 {TINY}"), timeout_s=900)
    assert result.status == "SUCCEEDED", result.logs[-5000:]
    metrics = check_metrics(output)
    assert all(0.0 <= metrics[key] <= 1.0 for key in ("all", "known", "novel"))
    # the gallery's predict of the test split (Ray Data actors, on the cluster) gives evaluate's predictions
    evaluated = pq.read_table(output / "predictions.parquet").sort_by("source_id")
    predicted = read_predictions(str(output / "gallery" / "predictions"))[0]
    assert predicted.column("source_id").to_pylist() == evaluated.column("source_id").to_pylist()
    assert predicted.column("pred").to_pylist() == evaluated.column("y_pred").to_pylist()
    assert (output / "gallery" / "index.html").is_file() and any((output / "gallery" / "thumbs").iterdir())
    assert result.logs.count("[ncdlr] epoch 1/1 done") == 1  # progress once, not twice (Ray Train's print patch)
