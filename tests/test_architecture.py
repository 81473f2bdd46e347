"""The checks of ``make lint`` that guard the tree's shape: the layering of docs/architecture.md
(import-linter contracts in pyproject.toml), imports of modules that do not exist, and code written
twice. Each holds on the tree as it is, and each breaks on a copy of the tree spoiled the way it
guards against."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import textwrap
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
        ("couponcenter/core/errors.py", "from couponcenter.coupons import rules", "kernel imports"),
        ("couponcenter/coupons/selectors.py", "from couponcenter.ops import overview", "Layers"),
        ("couponcenter/coupons/selectors.py", "from reminders import members", "Layers"),
        ("expiry/selectors.py", "from reminders import members", "never import each other"),
        ("reminders/engine/keys.py", "from django.conf import settings", "plain Python"),
        ("reminders/services/delivery.py", "from reminders.bench import engine", "Benchmarks"),
        ("couponcenter/coupons/models.py", "from couponcenter.coupons import bench", "Benchmarks"),
        ("couponcenter/coupons/stock.py", "from couponcenter.coupons import services", "cycles"),
        ("couponcenter/ops/api.py", "from couponcenter.ops.bench import console", "Benchmarks"),
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


def run_check(name: str, root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "bin" / name), str(root)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_every_import_names_something_that_exists():
    result = run_check("check-imports", ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("added", "said"),
    [
        (
            "if TYPE_CHECKING:\n    from reminders.runtime import gone\n",
            "'reminders.runtime' has no 'gone'",
        ),
        (
            "def later():\n    from reminders.engine.queue import no_such_name\n",
            "'reminders.engine.queue' has no 'no_such_name'",
        ),
        ("import no_such_package_anywhere\n", "no installed module 'no_such_package_anywhere'"),
    ],
)
def test_an_import_of_nothing_fails_the_check(copy_of_the_tree, added, said):
    path = copy_of_the_tree / "expiry" / "selectors.py"
    original = path.read_text()
    path.write_text(f"{original}\nfrom typing import TYPE_CHECKING\n{added}")
    try:
        result = run_check("check-imports", copy_of_the_tree)
    finally:
        path.write_text(original)
    assert result.returncode == 1
    assert "expiry/selectors.py:" in result.stdout and said in result.stdout, result.stdout


def test_the_production_code_says_nothing_twice():
    result = run_check("check-duplicates", ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_copied_block_fails_the_duplicate_check(copy_of_the_tree):
    source = copy_of_the_tree / "expiry" / "sweeper.py"
    target = copy_of_the_tree / "expiry" / "selectors.py"
    tree = ast.parse(source.read_text())
    longest = max(
        (node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)),
        key=lambda node: node.end_lineno - node.lineno,
    )
    block = textwrap.dedent(ast.get_source_segment(source.read_text(), longest, padded=True))
    original = target.read_text()
    target.write_text(f"{original}\n\n{block}\n")
    try:
        result = run_check("check-duplicates", copy_of_the_tree)
    finally:
        target.write_text(original)
    assert result.returncode == 1
    assert "expiry/selectors.py" in result.stdout and "expiry/sweeper.py" in result.stdout


def test_the_coupon_domain_keeps_its_app_label():
    """``couponcenter.coupons`` is the app labelled ``couponcenter``: its tables, migration history
    and permissions are keyed by that label, so they are the same rows whatever the package."""
    from django.apps import apps

    from couponcenter.coupons.models import Coupon

    config = apps.get_app_config("couponcenter")
    assert config.name == "couponcenter.coupons"
    assert Coupon._meta.app_label == "couponcenter"
    assert Coupon._meta.db_table == "couponcenter_coupon"
