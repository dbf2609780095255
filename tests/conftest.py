"""Shared pytest set-up: quiet Ray defaults and the fixture plugins of each layer."""

import os

for _key, _value in {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_AUTH_MODE": "disabled",
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.1",
    # Worker groups start slowly on a loaded 2-core machine; Train's 60 s default then retries forever.
    "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "900",
    "RAY_DATA_DISABLE_PROGRESS_BARS": "1",
    "AWS_EC2_METADATA_DISABLED": "true",
}.items():
    os.environ.setdefault(_key, _value)

_FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")
pytest_plugins = [f"tests.fixtures.{name[:-3]}" for name in sorted(os.listdir(_FIXTURES)) if name.endswith(".py") and name != "__init__.py"]
