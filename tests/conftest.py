"""Shared pytest set-up: quiet Ray defaults and the fixture plugins of each layer."""

import os

for _key, _value in {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_AUTH_MODE": "disabled",
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.1",
    "RAY_DATA_DISABLE_PROGRESS_BARS": "1",
    "AWS_EC2_METADATA_DISABLED": "true",
}.items():
    os.environ.setdefault(_key, _value)

pytest_plugins = [f"tests.fixtures.{name[:-3]}" for name in sorted(os.listdir(os.path.join(os.path.dirname(__file__), "fixtures"))) if name.endswith(".py") and name != "__init__.py"]
