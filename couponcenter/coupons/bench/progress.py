"""What the benchmark commands show: one tqdm bar per named phase while they run, then the
result."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO

from tqdm import tqdm

Progress = Callable[[str, int, int], None]


@contextmanager
def progress_bars(stream: TextIO) -> Iterator[Progress]:
    """``progress(what, done, total)``: a bar per ``what`` on ``stream``, all closed at the end;
    none when ``stream`` is not a terminal (a pipe or a log file gets no control codes)."""
    bars: dict[str, tqdm] = {}

    def progress(what: str, done: int, total: int) -> None:
        bar = bars.get(what)
        if bar is None:
            bar = bars[what] = tqdm(total=total, desc=what, file=stream, leave=False, disable=None)
        bar.update(done - bar.n)

    try:
        yield progress
    finally:
        for bar in bars.values():
            bar.close()


def result_write(out: Callable[[str], object], result: dict, *, as_json: bool) -> None:
    """A benchmark's result through ``out`` (a command's ``stdout.write``): one JSON line, or one
    line per figure, names aligned."""
    if as_json:
        out(json.dumps(result))
        return
    width = max(map(len, result), default=0)
    for name, value in result.items():
        out(f"{name:>{width}}: {value}")
