"""The project's directory as ``make run`` leaves it, for tests that run its processes."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def checkout(where: Path) -> Path:
    """The project's directory as ``make run`` leaves it (``.venv``, ``var/``), made of links to
    this one, so the test's ``var/`` is its own and ``.venv`` is the interpreter running it."""
    where.mkdir()
    for entry in ROOT.iterdir():
        if entry.name not in {".venv", "var", ".git"}:
            (where / entry.name).symlink_to(entry)
    (where / ".venv").symlink_to(Path(sys.prefix))
    (where / "var" / "prometheus").mkdir(parents=True)
    return where
