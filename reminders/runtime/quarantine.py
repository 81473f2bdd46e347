"""The quarantine of a worker process: a suspect job fires alone.

A suspect came back because the process firing it died, and a poison pill may kill its worker.
While one is in quarantine, every executor of the process takes no new work; the suspect fires
once what the others had in flight has settled and what they held has gone back to store, so a
pill that kills the process takes nothing else with it (what it would take comes back a suspect,
an attempt spent).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Protocol


class Member(Protocol):
    """An executor of the process, as the quarantine sees it (``TopicExecutor``)."""

    def firing(self) -> int: ...

    def wait_firing(self, at_most: int, timeout_s: float) -> None: ...

    def give_back_held(self, *, why: str, level: int) -> None: ...


class Quarantine:
    """Process-wide: how many suspects are in quarantine, and the executors they wait for."""

    TIMEOUT_S = 60  # a suspect waits no longer for the others (a call stuck past its timeout)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0
        self.executors: list[Member] = []

    @property
    def active(self) -> bool:
        return self._count > 0

    def enter(self) -> None:
        with self._lock:
            self._count += 1

    def leave(self) -> None:
        with self._lock:
            self._count -= 1

    def wait_alone(self, own: Member, own_jobs: int) -> None:
        """Until the suspect's own jobs are all the process has claimed: what the executors have
        in flight settled (held jobs wait meanwhile, at most their hold past their due time: see
        ``TopicExecutor._hold_loop``; one that fired meanwhile is waited for too), then what they
        still hold given back to store. Nothing is claimed again while the quarantine lasts
        (``room``), so nothing can be in flight beside the suspect from then until it settled."""
        deadline = time.monotonic() + self.TIMEOUT_S
        while True:
            for executor in list(self.executors):
                mine = own_jobs if executor is own else 0
                executor.wait_firing(mine, max(0.0, deadline - time.monotonic()))
            for executor in list(self.executors):
                executor.give_back_held(why="while a suspect fires alone", level=logging.INFO)
            if self._alone(own, own_jobs) or time.monotonic() >= deadline:
                return

    def _alone(self, own: Member, own_jobs: int) -> bool:
        return all(
            executor.firing() <= (own_jobs if executor is own else 0)
            for executor in list(self.executors)
        )
