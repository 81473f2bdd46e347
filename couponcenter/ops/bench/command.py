"""What the commands of the benchmarks that run the production processes share."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import connection

from couponcenter.core.process import sigterm_unwinds
from couponcenter.coupons.bench.progress import progress_bars


def run_production_bench(
    command: BaseCommand,
    *,
    name: str,
    needs_postgres: str,
    run: Callable[..., dict[str, Any]],
    report_lines: Callable[[dict[str, Any]], list[str]],
    as_json: bool,
) -> None:
    """Refuse what the run cannot do (no DEBUG: it loads and deletes data; not PostgreSQL,
    ``needs_postgres`` saying why), run it with progress bars and print its report or JSON."""
    if not settings.DEBUG:
        raise CommandError(f"{name} loads and deletes data: run it with DEBUG=1")
    if connection.vendor != "postgresql":
        raise CommandError(f"{name} needs PostgreSQL{needs_postgres}")
    sigterm_unwinds()  # what the run changed is put back and its processes stopped
    with progress_bars(command.stderr._out) as progress:
        result = run(progress=progress, say=command.stderr.write)
    if as_json:
        command.stdout.write(json.dumps(result, default=str))
    else:
        command.stdout.write("\n".join(report_lines(result)))
