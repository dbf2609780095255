"""A multi-node Ray cluster on one machine, and a job submitted to it through the Ray Jobs API.

This is the path users take on a real cluster (`ray start` on each node, `ray job submit` from a laptop),
shrunk onto one machine: a head and N worker nodes, each its own `ray start --block` process with its own
temp dir, ports and resources; the job goes through `JobSubmissionClient` exactly as `ray job submit` sends
it. Stopping terminates only the process groups started here (never `ray stop`, which would kill every Ray
process on the machine).

Usage (from the repository root, with the project's virtual environment)::

    .venv/bin/python cluster/simulate.py                    # embedded-default training job, checks metrics.json
    .venv/bin/python cluster/simulate.py --probe            # checks that the job sees and uses every node
    .venv/bin/python cluster/simulate.py --probe --auth token   # the same with Ray token auth, as in config.yaml
    .venv/bin/python cluster/simulate.py --entrypoint "python -m ncdlr.train_inat2k --help"
    .venv/bin/python cluster/simulate.py --train-args "--epochs 1"   # extra flags for the training job

Exit status 0 when the job SUCCEEDED and its checks passed; the job's log is printed either way.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

#: Quiet, small-machine settings shared by the cluster processes and the job (docs: platform-notes).
DEFAULT_ENV: dict[str, str] = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.1",
    "RAY_DATA_DISABLE_PROGRESS_BARS": "1",
    "AWS_EC2_METADATA_DISABLED": "true",
}
#: Keys that `python -m ncdlr.train_inat2k` writes into the top of `metrics.json` (ncdlr.metrics names).
METRIC_KEYS: tuple[str, ...] = ("all", "known", "novel")
#: Ray refuses object stores below this (ray_constants.OBJECT_STORE_MINIMUM_MEMORY_BYTES, 75 MiB).
MIN_OBJECT_STORE_BYTES = 75 * 1024 * 1024
TERMINAL_STATES = ("SUCCEEDED", "FAILED", "STOPPED")


class SimulationError(RuntimeError):
    """The simulated cluster could not start, or its job did not end as expected."""


@dataclass(frozen=True)
class NodeSpec:
    """Resources one simulated node advertises.

    Attributes:
        num_cpus: logical CPUs (may exceed the machine's cores; Ray only counts them).
        object_store_bytes: shared-memory object store size in bytes (≥ 75 MiB, Ray's minimum).
        resources: extra custom resources, e.g. {"node:sim-worker-1": 1} to pin probe tasks.
    """

    num_cpus: int = 2
    object_store_bytes: int = 256 * 1024 * 1024
    resources: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.num_cpus < 1:
            raise ValueError(f"NodeSpec.num_cpus must be >= 1, got {self.num_cpus}")
        if self.object_store_bytes < MIN_OBJECT_STORE_BYTES:
            raise ValueError(
                f"NodeSpec.object_store_bytes must be >= {MIN_OBJECT_STORE_BYTES} (75 MiB, Ray's minimum), "
                f"got {self.object_store_bytes}"
            )


@dataclass(frozen=True)
class JobResult:
    """How a submitted job ended: its submission id, terminal status, Ray's status message and full log."""

    job_id: str
    status: str
    message: str
    logs: str


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def node_resource_name(index: int) -> str:
    """Custom resource that marks simulated node `index` (0 = head); the probe pins one task to each."""
    return "sim_head" if index == 0 else f"sim_worker_{index}"


class SimulatedCluster:
    """A head and worker nodes as separate `ray start --block` processes on this machine.

    Use as a context manager; `dashboard_url` is the Jobs API address (what `ray job submit --address`
    takes). Each node's processes live in their own process group and temp dir under `root_dir`, so
    `stop()` ends exactly them.

    Args:
        nodes: one NodeSpec per node; the first is the head. Needs at least one.
        root_dir: where node temp dirs and logs go; a fresh short temp dir when None, removed on exit
            (Ray's socket paths must stay under ~107 characters, so keep it short).
        ray_executable: the `ray` CLI to run; defaults to the one beside this Python interpreter, so the
            cluster (and the job's `python`) use the same virtual environment.
        env: extra environment variables for every node process (and so for the job).
        start_timeout_s: how long to wait for all nodes to register.
        auth_token: run the cluster with Ray token auth (RAY_AUTH_MODE=token, this token on every node), as
            cluster/config.yaml does; requests from here carry it. None: auth disabled (127.0.0.1 only).
    """

    def __init__(
        self,
        nodes: Sequence[NodeSpec],
        root_dir: Path | None = None,
        ray_executable: Path | None = None,
        env: Mapping[str, str] | None = None,
        start_timeout_s: float = 120.0,
        auth_token: str | None = None,
    ) -> None:
        if not nodes:
            raise ValueError("SimulatedCluster needs at least one NodeSpec (the head)")
        self.nodes = list(nodes)
        self.ray_executable = Path(ray_executable or Path(sys.executable).parent / "ray")
        if not os.access(self.ray_executable, os.X_OK):
            raise SimulationError(
                f"ray CLI not found or not executable at {self.ray_executable}; install the project "
                "(make setup) or pass ray_executable"
            )
        self._owns_root = root_dir is None
        self.root_dir = Path(root_dir or tempfile.mkdtemp(prefix="ncdlr-sim-"))
        self.start_timeout_s = start_timeout_s
        self.auth_token = auth_token
        self.headers = {"Authorization": f"Bearer {auth_token}"} if auth_token else {}
        self.gcs_port = free_port()
        self.dashboard_port = free_port()
        self.env = self._node_env(env or {})
        self._procs: list[subprocess.Popen] = []
        self._logs: list[Path] = []

    # ---------------------------------------------------------------- lifecycle
    @property
    def gcs_address(self) -> str:
        return f"127.0.0.1:{self.gcs_port}"

    @property
    def dashboard_url(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    def node_temp_dir(self, index: int) -> Path:
        return self.root_dir / ("head" if index == 0 else f"w{index}")

    def __enter__(self) -> "SimulatedCluster":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()
        if self._owns_root:  # node logs and session dirs; the job's log was already returned by submit()
            shutil.rmtree(self.root_dir, ignore_errors=True)

    def start(self, attempts: int = 2) -> None:
        """Start the head, then each worker node; return once the Jobs API answers and all nodes are alive.

        On a loaded machine `ray start` can give up after its fixed 30 s wait for the raylet; then everything
        started so far is stopped and the whole cluster is tried again on fresh ports, `attempts` times in all.
        """
        for attempt in range(1, attempts + 1):
            try:
                self._start_once()
                return
            except SimulationError:
                self.stop()
                if attempt == attempts:
                    raise
                self.gcs_port, self.dashboard_port = free_port(), free_port()
                self.env["RAY_ADDRESS"] = self.gcs_address

    def _start_once(self) -> None:
        self._spawn(0, ["--head", f"--port={self.gcs_port}", "--include-dashboard=true",
                        "--dashboard-host=127.0.0.1", f"--dashboard-port={self.dashboard_port}",
                        f"--ray-client-server-port={free_port()}"])
        self._wait_for_dashboard()
        for index in range(1, len(self.nodes)):
            self._spawn(index, [f"--address={self.gcs_address}"])
        self._wait_for_nodes(len(self.nodes))

    def stop(self, grace_s: float = 20.0) -> None:
        """Terminate every node started here (workers first), escalating to SIGKILL of their process groups.

        SIGTERM lets `ray start --block` shut its own raylet, GCS, dashboard and workers down; whatever is
        left in the node's process group after `grace_s` is killed. Only groups created by this object are
        signalled.
        """
        for proc in reversed(self._procs):
            if proc.poll() is None:
                _signal_group(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for proc in reversed(self._procs):
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            _signal_group(proc.pid, signal.SIGKILL)  # stragglers in the group (workers, agents)
            proc.wait()
        self._procs.clear()
        self._logs.clear()

    def leftover_processes(self) -> list[str]:
        """Command lines of live processes that still reference this cluster's temp dirs (empty when clean)."""
        marker = str(self.root_dir)
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                raw = (entry / "cmdline").read_bytes()
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            cmdline = raw.replace(b"\0", b" ").decode(errors="replace")
            if marker in cmdline and state != "Z":
                found.append(f"{entry.name}: {cmdline[:200]}")
        return found

    # ---------------------------------------------------------------- jobs
    def submit(
        self,
        entrypoint: str,
        env_vars: Mapping[str, str] | None = None,
        timeout_s: float = 900.0,
        poll_s: float = 1.0,
    ) -> JobResult:
        """Submit `entrypoint` through the Ray Jobs API, wait until it ends, and return status and log.

        The job runs in the cluster's environment (this virtual environment's `python` first on PATH, plus
        DEFAULT_ENV), so `python -m ncdlr...` imports the installed package; `env_vars`, when given, become
        the job's runtime_env (they then reach every task and actor of the job). A job still
        running after `timeout_s` is stopped and reported with status "TIMEOUT".
        """
        from ray.job_submission import JobSubmissionClient

        client = JobSubmissionClient(self.dashboard_url, headers=self.headers)
        job_id = client.submit_job(
            entrypoint=entrypoint,
            # Only what the caller asks for: the job already inherits DEFAULT_ENV from the node processes,
            # and a job-level env var that the driver's own ray.init(runtime_env=...) also sets is a conflict.
            runtime_env={"env_vars": dict(env_vars)} if env_vars else None,
            metadata={"submitted_by": "cluster/simulate.py"},
        )
        deadline = time.monotonic() + timeout_s
        status = str(client.get_job_status(job_id))
        while not _is_terminal(status):
            if time.monotonic() > deadline:
                client.stop_job(job_id)
                return JobResult(job_id, "TIMEOUT", f"still {status} after {timeout_s:.0f} s; stopped",
                                 client.get_job_logs(job_id))
            time.sleep(poll_s)
            status = str(client.get_job_status(job_id))
        info = client.get_job_info(job_id)
        return JobResult(job_id, _status_name(status), info.message or "", client.get_job_logs(job_id))

    # ---------------------------------------------------------------- internals
    def _node_env(self, extra: Mapping[str, str]) -> dict[str, str]:
        env = dict(os.environ)
        env.update(DEFAULT_ENV)
        # A fresh `ray start` turns token auth on in Ray 2.60 (and would then need a token): say which we want.
        env.pop("RAY_AUTH_TOKEN_PATH", None)
        if self.auth_token:
            env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=self.auth_token)
        else:
            env["RAY_AUTH_MODE"] = "disabled"
            env.pop("RAY_AUTH_TOKEN", None)
        env["PATH"] = f"{self.ray_executable.parent}{os.pathsep}{env.get('PATH', '')}"
        # Ray processes that look their cluster up by address=None (e.g. Ray Train's placement-group cleaner)
        # find several clusters on a shared machine and fail; point them at this one.
        env["RAY_ADDRESS"] = self.gcs_address
        env.update(extra)
        return env

    def _spawn(self, index: int, role_args: list[str]) -> None:
        spec = self.nodes[index]
        temp_dir = self.node_temp_dir(index)
        temp_dir.mkdir(parents=True, exist_ok=True)
        resources = {node_resource_name(index): 1, **spec.resources}
        args = [
            str(self.ray_executable), "start", "--block", *role_args,
            "--node-ip-address=127.0.0.1",
            f"--num-cpus={spec.num_cpus}", "--num-gpus=0",
            f"--object-store-memory={spec.object_store_bytes}",
            f"--resources={json.dumps(resources)}",
            f"--temp-dir={temp_dir}",
            # Every port explicit: several nodes share this machine (and other Ray users may too).
            f"--node-manager-port={free_port()}", f"--object-manager-port={free_port()}",
            f"--dashboard-agent-listen-port={free_port()}", f"--dashboard-agent-grpc-port={free_port()}",
            f"--metrics-export-port={free_port()}", f"--runtime-env-agent-port={free_port()}",
            "--disable-usage-stats",
        ]
        log_path = self.root_dir / f"node{index}-{self.gcs_port}.log"
        log = open(log_path, "wb")
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=self.env, start_new_session=True)
        log.close()
        self._procs.append(proc)
        self._logs.append(log_path)

    def _check_alive(self) -> None:
        for index, proc in enumerate(self._procs):
            if proc.poll() is not None:
                tail = self._logs[index].read_text(errors="replace")[-3000:]
                raise SimulationError(f"node {index} (`ray start`) exited with code {proc.returncode}:\n{tail}")

    def _wait_for_dashboard(self) -> None:
        import urllib.request

        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                request = urllib.request.Request(f"{self.dashboard_url}/api/version", headers=self.headers)
                with urllib.request.urlopen(request, timeout=2) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        raise SimulationError(f"Ray dashboard at {self.dashboard_url} did not answer in {self.start_timeout_s} s")

    def _wait_for_nodes(self, count: int) -> None:
        from ray.util.state import StateApiClient
        from ray.util.state.common import ListApiOptions, StateResource

        deadline = time.monotonic() + self.start_timeout_s
        alive = 0
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                nodes = StateApiClient(self.dashboard_url, headers=self.headers).list(
                    StateResource.NODES, options=ListApiOptions(), raise_on_missing_output=False)
                alive = sum(node.state == "ALIVE" for node in nodes)
            except Exception:  # the state API answers only once the GCS and dashboard are up
                alive = 0
            if alive >= count:
                return
            time.sleep(0.5)
        raise SimulationError(f"only {alive} of {count} nodes registered within {self.start_timeout_s} s")


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)  # the group id equals the pid: start_new_session=True made it a leader
    except ProcessLookupError:
        pass


def _status_name(status: object) -> str:
    return str(status).rsplit(".", 1)[-1]


def _is_terminal(status: object) -> bool:
    return _status_name(status) in TERMINAL_STATES


# -------------------------------------------------------------------- checks
def check_metrics(run_dir: Path, keys: Sequence[str] = METRIC_KEYS) -> dict:
    """Load `run_dir/metrics.json` and require `keys` at its top level; return the parsed dict.

    Raises SimulationError naming the file when it is missing, not JSON, not an object, or lacks a key.
    """
    path = Path(run_dir) / "metrics.json"
    if not path.is_file():
        raise SimulationError(f"{path} does not exist: the job wrote no metrics.json at the top of --output")
    try:
        metrics = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise SimulationError(f"{path} is not valid JSON: {err}") from err
    if not isinstance(metrics, dict):
        raise SimulationError(f"{path} holds a {type(metrics).__name__}, expected a JSON object")
    missing = [key for key in keys if key not in metrics]
    if missing:
        raise SimulationError(f"{path} lacks keys {missing}; it has {sorted(metrics)}")
    return metrics


def probe_entrypoint(expect_nodes: int) -> str:
    """Job entrypoint that runs `run_probe` (below) with this file, through the job's own `python`."""
    return f"python {shlex.quote(str(Path(__file__).resolve()))} --run-probe {expect_nodes}"


def run_probe(expect_nodes: int) -> dict:
    """Inside a job: require `expect_nodes` alive nodes and run one task pinned to each simulated node.

    Prints one JSON line `PROBE {...}` with the cluster's resources and the node id each task ran on;
    raises SimulationError when a node is missing or two pinned tasks ran on the same node.
    """
    import ray

    ray.init(log_to_driver=False)
    alive = [node for node in ray.nodes() if node["Alive"]]
    if len(alive) != expect_nodes:
        raise SimulationError(f"the job sees {len(alive)} alive nodes, expected {expect_nodes}")

    @ray.remote(num_cpus=1)
    def where() -> str:
        return ray.get_runtime_context().get_node_id()

    names = [node_resource_name(i) for i in range(expect_nodes)]
    node_ids = ray.get([where.options(resources={name: 0.01}).remote() for name in names])
    if len(set(node_ids)) != expect_nodes:
        raise SimulationError(f"pinned tasks ran on {len(set(node_ids))} distinct nodes, expected {expect_nodes}")
    report = {"alive_nodes": len(alive), "cluster_resources": ray.cluster_resources(),
              "task_nodes": dict(zip(names, node_ids))}
    print("PROBE " + json.dumps(report, sort_keys=True), flush=True)
    return report


def parse_probe(logs: str) -> dict:
    """The report that `run_probe` printed into a job log; SimulationError when absent."""
    for line in logs.splitlines():
        if line.startswith("PROBE "):
            return json.loads(line[len("PROBE "):])
    raise SimulationError("no PROBE line in the job log: the probe did not finish")


def training_entrypoint(output_dir: Path, extra_args: str = "") -> str:
    """`python -m ncdlr.train_inat2k` on its embedded default, writing the run into `output_dir`.

    `--shared-storage true`: the simulated nodes are processes on this one machine, so the local checkpoint
    storage under `output_dir` is a filesystem every node reaches (on a real cluster, pass s3:// storage)."""
    command = f"python -m ncdlr.train_inat2k --output {shlex.quote(str(output_dir))} --shared-storage true"
    return f"{command} {extra_args}".strip()


# -------------------------------------------------------------------- CLI
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--probe", action="store_true", help="submit the node-visibility probe instead of training")
    what.add_argument("--entrypoint", help="submit this shell command instead; only SUCCEEDED is checked")
    what.add_argument("--run-probe", type=int, metavar="N", help=argparse.SUPPRESS)  # runs inside the job
    parser.add_argument("--train-args", default="", help="extra flags for python -m ncdlr.train_inat2k")
    parser.add_argument("--output", type=Path, help="run directory for the training job (default: a temp dir)")
    parser.add_argument("--worker-nodes", type=int, default=1, help="worker nodes besides the head (default 1)")
    parser.add_argument("--cpus-per-node", type=int, default=2, help="logical CPUs per node (default 2)")
    parser.add_argument("--object-store-mib", type=int, default=256, help="object store per node (default 256)")
    parser.add_argument("--timeout-s", type=float, default=900.0, help="stop the job after this long (default 900)")
    parser.add_argument("--auth", choices=("token", "disabled"), default="disabled",
                        help="token: Ray token auth with a fresh random token, as on a real cluster (default disabled)")
    args = parser.parse_args(argv)

    if args.run_probe is not None:
        run_probe(args.run_probe)
        return 0
    if args.worker_nodes < 0:
        parser.error(f"--worker-nodes must be >= 0, got {args.worker_nodes}")

    spec = NodeSpec(num_cpus=args.cpus_per_node, object_store_bytes=args.object_store_mib * 1024 * 1024)
    output = None
    if args.probe:
        entrypoint = probe_entrypoint(1 + args.worker_nodes)
    elif args.entrypoint:
        entrypoint = args.entrypoint
    else:
        output = args.output or Path(tempfile.mkdtemp(prefix="ncdlr-sim-run-"))
        entrypoint = training_entrypoint(output, args.train_args)

    # SIGTERM (a CI timeout, `kill`) unwinds like Ctrl-C, so the cluster below is stopped, not orphaned.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    token = secrets.token_hex(16) if args.auth == "token" else None
    with SimulatedCluster([spec] * (1 + args.worker_nodes), auth_token=token) as cluster:
        print(f"cluster up: head + {args.worker_nodes} worker node(s); Jobs API at {cluster.dashboard_url}")
        print(f"submitting: {entrypoint}", flush=True)
        result = cluster.submit(entrypoint, timeout_s=args.timeout_s)
    print(result.logs)
    print(f"job {result.job_id}: {result.status} {result.message}")
    if result.status != "SUCCEEDED":
        return 1
    if args.probe:
        print("probe:", json.dumps(parse_probe(result.logs)["task_nodes"]))
    elif output is not None:
        metrics = check_metrics(output)
        print(f"metrics.json at {output}: " + ", ".join(f"{k}={metrics[k]}" for k in METRIC_KEYS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
