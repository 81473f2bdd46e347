"""The layering of DESIGN.md section 1, as ``make lint`` checks it (import-linter contracts in
pyproject.toml): the tree keeps every contract, and a forbidden import breaks them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(root / "pyproject.toml"), "--no-cache"],
        cwd=root, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.fixture(scope="module")
def copy_of_the_tree(tmp_path_factory) -> Path:
    copy = tmp_path_factory.mktemp("tree")
    shutil.copy(ROOT / "pyproject.toml", copy)
    for package in ("couponcenter", "reminders", "expiry"):
        shutil.copytree(
            ROOT / package, copy / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    return copy


def test_the_tree_keeps_every_contract():
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "forbidden", "contract"),
    [
        ("couponcenter/core/errors.py", "from reminders import models", "kernel imports no app"),
        ("couponcenter/selectors.py", "from reminders import members", "Layers"),
        ("expiry/selectors.py", "from reminders import members", "never import each other"),
        ("reminders/engine/keys.py", "from django.conf import settings", "plain Python"),
        ("reminders/services/delivery.py", "from reminders.bench import engine", "Benchmarks"),
        ("couponcenter/ops/api.py", "from couponcenter.ops.bench import console", "Benchmarks"),
        ("couponcenter/stock.py", "from couponcenter import services", "cycles"),
    ],
)
def test_a_forbidden_import_breaks_a_contract(copy_of_the_tree, module, forbidden, contract):
    path = copy_of_the_tree / module
    original = path.read_text()
    path.write_text(f"{original}\n{forbidden}  # noqa\n")
    try:
        result = lint_imports(copy_of_the_tree)
    finally:
        path.write_text(original)
    assert result.returncode != 0
    broken = [line for line in result.stdout.splitlines() if " BROKEN" in line]
    assert any(contract in line for line in broken), result.stdout
