"""cluster/config.yaml passes the checks `ray up` runs before it contacts AWS, and keeps our invariants.

`ray up` calls `commands._bootstrap_config`: `prepare_config` (defaults, setup-command merge, docker
check, per-type min/max workers), then the provider's resource autodetection (an EC2 API call, skipped
here: every node type states its CPU and GPU explicitly, so nothing is left to autodetect), then
`validate_config` (Ray's ray-schema.json plus its cross-field rules). Only the provider's bootstrap
(IAM, subnets, security groups) needs the cloud.
"""

import copy
import functools
from pathlib import Path

import jsonschema
import pytest
import yaml
from ray.autoscaler._private.node_provider_availability_tracker import NodeAvailabilitySummary
from ray.autoscaler._private.resource_demand_scheduler import _default_utilization_scorer, get_nodes_for
from ray.autoscaler._private.util import prepare_config, validate_config

CONFIG_PATH = Path(__file__).resolve().parents[2] / "cluster" / "config.yaml"


@pytest.fixture()
def raw_config() -> dict:
    return yaml.safe_load(CONFIG_PATH.read_text())


@pytest.fixture()
def prepared(raw_config) -> dict:
    config = prepare_config(copy.deepcopy(raw_config))
    validate_config(config)
    return config


def gpu_types(config: dict) -> dict[str, dict]:
    return {name: node for name, node in config["available_node_types"].items()
            if node["resources"].get("GPU", 0) > 0}


def test_config_passes_ray_up_offline_validation(prepared):
    assert prepared["provider"]["type"] == "aws"
    assert prepared["head_node_type"] in prepared["available_node_types"]


def test_every_node_type_states_cpu_and_gpu_so_no_cloud_autodetection_is_needed(raw_config):
    for name, node in raw_config["available_node_types"].items():
        assert {"CPU", "GPU"} <= set(node["resources"]), name
        assert node["node_config"]["InstanceType"], name


def test_gpu_worker_types_exist_and_scale_from_zero(prepared):
    gpus = gpu_types(prepared)
    assert {node["resources"]["GPU"] for node in gpus.values()} >= {1, 4, 8}
    for name, node in gpus.items():
        assert node["min_workers"] == 0, name
        assert node["max_workers"] >= 1, name


def test_head_has_no_gpu_resources(prepared):
    head = prepared["available_node_types"][prepared["head_node_type"]]
    assert head["resources"]["GPU"] == 0
    assert head["max_workers"] == 0


def test_autoscaler_places_an_8_gpu_job_on_gpu_workers_only(prepared):
    """Ray's own bin-packing for 8 ScalingConfig bundles {CPU: 1, GPU: 1} adds only GPU node types."""
    node_types = prepared["available_node_types"]
    to_add, residual = get_nodes_for(
        node_types, existing_nodes={prepared["head_node_type"]: 1}, head_node_type=prepared["head_node_type"],
        max_to_add=prepared["max_workers"], resources=[{"CPU": 1, "GPU": 1}] * 8,
        utilization_scorer=functools.partial(  # every type available: no recent launch failures
            _default_utilization_scorer, node_availability_summary=NodeAvailabilitySummary({})),
    )
    assert residual == []
    assert to_add and all(node_types[name]["resources"]["GPU"] > 0 for name in to_add)
    assert sum(to_add[name] * node_types[name]["resources"]["GPU"] for name in to_add) >= 8


def test_idle_timeout_is_set(prepared):
    assert 1 <= prepared["idle_timeout_minutes"] <= 60


def test_spot_is_used_for_some_gpu_type_and_stopped_nodes_are_not_kept(raw_config):
    markets = {name: node["node_config"].get("InstanceMarketOptions", {}).get("MarketType")
               for name, node in gpu_types(raw_config).items()}
    assert "spot" in markets.values()
    assert raw_config["provider"]["cache_stopped_nodes"] is False


def test_setup_is_minimal_because_the_image_carries_everything(prepared):
    assert prepared["setup_commands"] == [] and prepared["head_setup_commands"] == []
    assert prepared["worker_setup_commands"] == []
    assert prepared["docker"]["image"]


def test_every_node_gets_an_instance_profile_for_s3(raw_config):
    for name, node in raw_config["available_node_types"].items():
        assert node["node_config"]["IamInstanceProfile"]["Arn"].startswith("arn:aws:iam::"), name


def test_nodes_start_ray_with_token_auth(raw_config):
    commands = raw_config["head_start_ray_commands"] + raw_config["worker_start_ray_commands"]
    starts = [command for command in commands if "ray start" in command]
    assert len(starts) == 2 and all("RAY_AUTH_MODE=token" in command for command in starts)
    assert "~/.ray/auth_token" in raw_config["file_mounts"].values()


def test_validation_rejects_a_misspelled_top_level_key(raw_config):
    raw_config["idle_timeout_minute"] = raw_config.pop("idle_timeout_minutes")
    with pytest.raises(jsonschema.ValidationError, match="idle_timeout_minute"):
        validate_config(prepare_config(raw_config))


def test_validation_rejects_a_fractional_resource(raw_config):
    raw_config["available_node_types"]["gpu.1x.a10g"]["resources"]["GPU"] = 0.5
    with pytest.raises(jsonschema.ValidationError, match="0.5"):
        validate_config(prepare_config(raw_config))


def test_validation_rejects_a_head_type_that_is_not_declared(raw_config):
    raw_config["head_node_type"] = "head.missing"
    with pytest.raises(ValueError, match="head_node_type"):
        validate_config(prepare_config(raw_config))
