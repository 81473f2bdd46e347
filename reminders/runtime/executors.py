"""The executors of one worker process: one per generic topic (``topic_executor``), rebuilt when
the topic's spec changes, and the quarantine they share (``quarantine``)."""

from __future__ import annotations

import threading
from collections.abc import Callable

from reminders.engine.clock import epoch_ms
from reminders.runtime.quarantine import Quarantine
from reminders.runtime.topic_executor import Clock, FireBatch, Settle, Take, TopicExecutor
from reminders.timeout_topic_rules import TimeoutTopicSpec


class TopicExecutors:
    """The executors of one worker process, one per generic topic, rebuilt when its spec
    changes (the old one finishes and settles what it holds, in the background)."""

    def __init__(
        self,
        *,
        fire: FireBatch,
        settle: Settle,
        inline: bool = False,
        take: Take | None = None,
        clock: Clock | None = None,
    ) -> None:
        self._fire = fire
        self._settle = settle
        self._take = take  # None: nothing is held (every entry is taken when claimed)
        self.clock = clock or epoch_ms
        self.inline = inline
        self.on_room: Callable[[], None] | None = None  # set by the worker: Dispatcher.wake
        self.quarantine = Quarantine()
        self._by_topic: dict[str, TopicExecutor] = {}
        self._retiring: set[TopicExecutor] = set()  # closing in the background, still firing
        self._members_lock = threading.Lock()
        self._retired_counts: dict[str, int] = {}

    def sync(self, specs: dict[str, TimeoutTopicSpec]) -> None:
        for name in list(self._by_topic):
            if name not in specs:
                self._retire(self._by_topic.pop(name))
        for name, spec in specs.items():
            current = self._by_topic.get(name)
            if current is not None and current.spec == spec:
                continue
            if current is not None:
                self._retire(current)
            self._by_topic[name] = TopicExecutor(
                spec,
                fire=self._fire,
                settle=self._settle,
                inline=self.inline,
                quarantine=self.quarantine,
                on_room=lambda: self.on_room and self.on_room(),
                take=self._take,
                clock=self.clock,
            )
        self._quarantine_members()

    def _quarantine_members(self) -> None:
        """A suspect waits for every executor of the process, the retiring ones too."""
        with self._members_lock:
            self.quarantine.executors = [*self._by_topic.values(), *self._retiring]

    def _retire(self, executor: TopicExecutor) -> None:
        for name, n in executor.counts.items():  # what it settles from now on is not counted
            self._retired_counts[name] = self._retired_counts.get(name, 0) + n
        if executor.inline:
            return

        def close() -> None:
            try:
                executor.close()
            finally:
                self._retiring.discard(executor)
                self._quarantine_members()

        self._retiring.add(executor)
        threading.Thread(target=close, name=f"retire-{executor.spec.name}", daemon=True).start()

    def get(self, topic: str) -> TopicExecutor | None:
        return self._by_topic.get(topic)

    def load(self) -> dict[str, list[int]]:
        """Per topic: [jobs taking room (held, waiting for a call or firing; not those fired and
        waiting to be settled), how many it takes in (its queue's capacity), threads]."""
        return {
            name: [e.occupying, e.capacity, e.spec.concurrency]
            for name, e in list(self._by_topic.items())
        }

    def counts(self) -> dict[str, int]:
        """Totals over this process's executors (retired ones included)."""
        total = dict(self._retired_counts)
        for executor in list(self._by_topic.values()):
            for name, n in executor.counts.items():
                total[name] = total.get(name, 0) + n
        return total

    def wait_idle(self, timeout_s: float) -> bool:
        return all(e.wait_idle(timeout_s) for e in list(self._by_topic.values()))

    def close(self) -> None:
        for executor in list(self._by_topic.values()):
            executor.close(wait=True)
        self._by_topic.clear()
