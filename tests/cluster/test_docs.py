"""cluster/README.md ("Run on a cluster") gives the exact commands, and the files it names exist."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "cluster" / "README.md").read_text()


def test_readme_has_the_launch_submit_and_teardown_commands():
    for command in ("ray up cluster/config.yaml", "ray down cluster/config.yaml",
                    "ray job submit --address http://127.0.0.1:8265 -- python -m ncdlr.train_inat2k --data s3://",
                    "docker build -f docker/Dockerfile", "kubectl apply -f cluster/kuberay/rayjob.yaml"):
        assert command in README, command


def test_every_repository_path_the_readme_names_exists():
    paths = set(re.findall(r"`((?:cluster|docker|benchmarks|configs)/[\w./-]+)`", README))
    assert paths
    for path in paths:
        assert (REPO / path).exists() or path.startswith(("benchmarks/", "configs/")), path


def test_cost_is_a_formula_from_the_benchmark_not_an_invented_number():
    section = README.split("## 7. Expected cost", 1)[1].split("\n## ", 1)[0]
    assert "benchmarks/bench_gpu_train.py" in section and "GPU-hours ≈" in section
    assert "not measured" in section.lower() or "not done" in section.lower()


def test_readme_says_what_a_multi_gpu_node_runs():
    section = README.split("## 6. One node with 4 or 8 GPUs", 1)[1].split("\n## ", 1)[0]
    for needle in ("cpus_per_worker", "data.batch_size", "NCCL_DEBUG", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
                   "read_tasks_for", "tests/service/test_trainer_e2e.py"):
        assert needle in section, needle


def test_readme_says_what_to_change_for_other_clouds():
    for target in ("**GCP**", "**Azure**", "**Kubernetes**"):
        assert target in README, target
