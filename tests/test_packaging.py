"""``pip install -e ".[dev]"`` without the lock file gets a working set: the requirements of
``pyproject.toml`` admit the locked versions, and the OpenTelemetry packages are pinned as one
family (open ranges over them made pip give up with ResolutionImpossible). ``.ci/run`` also has pip
itself resolve ``pyproject.toml`` from the index; this test needs no network."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]


def requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    listed = project["dependencies"] + project["optional-dependencies"]["dev"]
    return [Requirement(line) for line in listed]


def locked() -> dict[str, str]:
    lines = (ROOT / "requirements.lock").read_text().splitlines()
    pins = (re.match(r"^([A-Za-z0-9._-]+)==(\S+)", line) for line in lines)
    return {canonicalize_name(m[1]): m[2] for m in pins if m}


def test_every_requirement_admits_its_locked_version():
    lock = locked()
    for req in requirements():
        version = lock.get(canonicalize_name(req.name))
        assert version is not None, f"{req.name} is not in requirements.lock: `make lock`"
        assert req.specifier.contains(version, prereleases=True), (
            f"requirements.lock has {req.name}=={version}, outside {req} in pyproject.toml"
        )


def test_the_opentelemetry_packages_are_one_release():
    """The instrumentations pin the core of their own release exactly: each one and the SDK are
    pinned (``==``) to one release, the one the lock was resolved with."""
    otel = [r for r in requirements() if r.name.startswith("opentelemetry-")]
    assert otel
    releases = {}
    for req in otel:
        [spec] = list(req.specifier)
        assert spec.operator == "==", f"{req}: pin the OpenTelemetry family to one release"
        part = "contrib" if req.name.startswith("opentelemetry-instrumentation") else "core"
        releases.setdefault(part, set()).add(spec.version)
    assert all(len(versions) == 1 for versions in releases.values()), releases
