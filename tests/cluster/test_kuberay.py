"""cluster/kuberay/*.yaml: well-formed KubeRay v1 resources that run the same image and entrypoint as the
autoscaler config and the README.

KubeRay's CRD schemas (ray.io_rayclusters.yaml, ray.io_rayjobs.yaml) ship with no pip/Debian/npm package,
so they cannot be loaded offline. What is validated instead:
- every pod template (head and each worker group) against Kubernetes' own PodTemplateSpec JSON schema in
  strict mode (kubernetes-validate, which carries the upstream schemas) — the bulk of the manifests;
- the KubeRay fields we rely on, by name and type, as the v1 CRD defines them: apiVersion ray.io/v1, kind,
  spec.rayVersion, spec.enableInTreeAutoscaling, spec.autoscalerOptions.idleTimeoutSeconds,
  spec.headGroupSpec.{rayStartParams,template}, spec.workerGroupSpecs[].{groupName,replicas,minReplicas,
  maxReplicas,rayStartParams,template}, and for RayJob spec.{entrypoint,rayClusterSpec,
  shutdownAfterJobFinishes,ttlSecondsAfterFinished,submissionMode}.
"""

import re
import shlex
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import latest_version

REPO = Path(__file__).resolve().parents[2]
KUBERAY = REPO / "cluster" / "kuberay"
ENTRYPOINT_PREFIX = "python -m ncdlr.train_inat2k"


def load(name: str) -> dict:
    return yaml.safe_load((KUBERAY / name).read_text())


@pytest.fixture()
def raycluster() -> dict:
    return load("raycluster.yaml")


@pytest.fixture()
def rayjob() -> dict:
    return load("rayjob.yaml")


def cluster_specs(raycluster: dict, rayjob: dict) -> list[dict]:
    return [raycluster["spec"], rayjob["spec"]["rayClusterSpec"]]


def pod_templates(spec: dict) -> list[dict]:
    return [spec["headGroupSpec"]["template"]] + [group["template"] for group in spec["workerGroupSpecs"]]


def validate_pod_template(template: dict) -> None:
    kubernetes_validate.validate(
        {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "check"}, "template": template},
        latest_version(), strict=True,
    )


def locked_ray_version() -> str:
    return re.search(r"^ray==(\S+)$", (REPO / "requirements.lock").read_text(), re.MULTILINE).group(1)


def test_kinds_and_api_version(raycluster, rayjob):
    assert (raycluster["apiVersion"], raycluster["kind"]) == ("ray.io/v1", "RayCluster")
    assert (rayjob["apiVersion"], rayjob["kind"]) == ("ray.io/v1", "RayJob")
    assert raycluster["metadata"]["name"] and rayjob["metadata"]["name"]


def test_cluster_spec_required_fields_and_autoscaling(raycluster, rayjob):
    for spec in cluster_specs(raycluster, rayjob):
        assert spec["rayVersion"] == locked_ray_version()
        assert spec["enableInTreeAutoscaling"] is True
        assert spec["autoscalerOptions"]["idleTimeoutSeconds"] > 0
        assert isinstance(spec["headGroupSpec"]["rayStartParams"], dict)
        assert spec["headGroupSpec"]["template"]["spec"]["containers"]
        assert spec["workerGroupSpecs"]
        for group in spec["workerGroupSpecs"]:
            assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", group["groupName"]), group["groupName"]
            assert 0 <= group["minReplicas"] <= group["replicas"] <= group["maxReplicas"], group["groupName"]
            assert all(isinstance(v, str) for v in group["rayStartParams"].values()), group["groupName"]


def test_pod_templates_match_the_kubernetes_schema(raycluster, rayjob):
    for spec in cluster_specs(raycluster, rayjob):
        for template in pod_templates(spec):
            validate_pod_template(template)


def test_schema_check_rejects_a_misspelled_container_field(raycluster):
    template = raycluster["spec"]["headGroupSpec"]["template"]
    container = template["spec"]["containers"][0]
    container["imagePullPolice"] = container.pop("image")
    with pytest.raises(kubernetes_validate.ValidationError, match="imagePullPolice"):
        validate_pod_template(template)


def test_head_has_no_gpu(raycluster):
    head = raycluster["spec"]["headGroupSpec"]
    assert head["rayStartParams"]["num-gpus"] == "0"
    for container in head["template"]["spec"]["containers"]:
        for kind in ("requests", "limits"):
            assert "nvidia.com/gpu" not in container["resources"].get(kind, {})


def test_gpu_groups_scale_from_zero_with_matching_requests_and_limits(raycluster):
    gpu_groups = [group for group in raycluster["spec"]["workerGroupSpecs"]
                  if "nvidia.com/gpu" in group["template"]["spec"]["containers"][0]["resources"]["limits"]]
    assert {group["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
            for group in gpu_groups} >= {"1", "8"}
    for group in gpu_groups:
        resources = group["template"]["spec"]["containers"][0]["resources"]
        assert group["minReplicas"] == 0, group["groupName"]
        assert resources["requests"]["nvidia.com/gpu"] == resources["limits"]["nvidia.com/gpu"]


def test_rayjob_creates_exactly_the_raycluster_spec(raycluster, rayjob):
    assert rayjob["spec"]["rayClusterSpec"] == raycluster["spec"]


def test_rayjob_cleans_up_after_itself(rayjob):
    spec = rayjob["spec"]
    assert spec["shutdownAfterJobFinishes"] is True
    assert spec["ttlSecondsAfterFinished"] >= 0
    assert spec["submissionMode"] in {"K8sJobMode", "HTTPMode", "SidecarMode", "InteractiveMode"}


def test_every_container_runs_the_autoscaler_configs_image(raycluster, rayjob):
    image = yaml.safe_load((REPO / "cluster" / "config.yaml").read_text())["docker"]["image"]
    for spec in cluster_specs(raycluster, rayjob):
        for template in pod_templates(spec):
            assert [c["image"] for c in template["spec"]["containers"]] == [image]


def test_rayjob_entrypoint_is_the_readme_job(rayjob):
    entrypoint = rayjob["spec"]["entrypoint"]
    words = shlex.split(entrypoint)
    assert entrypoint.startswith(ENTRYPOINT_PREFIX)
    assert words[words.index("--data") + 1].startswith("s3://")
    assert words[words.index("--use-gpu") + 1] == "true" and int(words[words.index("--num-workers") + 1]) >= 1
    readme = (REPO / "cluster" / "README.md").read_text()
    assert f"-- {entrypoint}" in readme, "cluster/README.md's `ray job submit` runs another entrypoint"


def test_token_auth_uses_the_secret_the_readme_creates(raycluster, rayjob):
    readme = (REPO / "cluster" / "README.md").read_text()
    for spec in cluster_specs(raycluster, rayjob):
        assert spec["authOptions"]["mode"] == "token"
        assert f"kubectl create secret generic {spec['authOptions']['secretName']} " in readme


def test_rayjob_entrypoint_parses_with_the_jobs_own_command_line(rayjob):
    from ncdlr.service.config import load_config
    from ncdlr.service.entry import CONFIGS
    from ncdlr.train_inat2k import build_parser

    args = build_parser().parse_args(shlex.split(rayjob["spec"]["entrypoint"])[3:])
    assert args.data.startswith("s3://")
    assert (CONFIGS / "inat18_2k.yaml").is_file() and load_config(CONFIGS / "inat18_2k.yaml")
