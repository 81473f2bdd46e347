"""Progress bars for the benchmark commands: one tqdm bar per named phase."""

from __future__ import annotations

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
