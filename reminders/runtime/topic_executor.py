"""Firing generic timeout jobs off the dispatch loop: the executor of one topic in one worker.

The dispatch loop only claims, takes the rows (one ``UPDATE ... RETURNING``) and hands the jobs
to their topic's executor; it never waits for a receiver. An executor fires with its topic's own
concurrency and timeout:

- ``http``: one job per call, on one keep-alive ``OutboundPool`` (``concurrency`` connections);
- ``celery``: one task per batch; ``callable``: called with the batch; ``log``: logs it.

A single settler thread per executor gathers what fired and settles it in bulk
(``timeout_jobs.settle_fired``: rows first, then ack or nack in the engine). A slow or dead
receiver fills only its own topic's executor: ``room()`` goes to 0 and the dispatcher stops
claiming that topic (its jobs wait in Redis) while every other topic, and the reminders, go on.
The slot leases are renewed by the loop, which nothing here blocks.

Holding: a threaded worker claims a generic topic's jobs up to ``TIMEOUT_HOLD_MS`` before they
fall due (the topic's look-ahead) and hands them to the executor as they are, rows untouched. Its
timer thread waits for each job's due time, then takes the rows (pending to running, the same
conditional ``UPDATE``) and fires them: the due moment pays for one statement and the call, not
for the loop's sleep and claim. A cancel or a reschedule that commits before the due time still
wins (the take refuses the row, and the entry is acked); a job claimed again while held (a
reschedule to sooner) replaces its older copy, which is then neither fired nor acked. While a
suspect waits to fire alone (``quarantine.Quarantine``), held jobs that fall due wait for it, at
most ``hold_ms`` more; what is still held when it fires goes back to store, due as it was, no
attempt spent (``queue.unclaim``), and is claimed again once it settled; so does what is still
held when the executor closes.

``inline=True`` (the ``--once`` drain and the tests) fires and settles in the caller's thread,
through the same code, and holds nothing.

One module for one class: the pool, the holding timer and the settler share one lock and one
count of what is in flight, and each reads the others' state under it.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import queue as stdlib_queue
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from django.conf import settings
from django.db import close_old_connections

from couponcenter.core.webhooks import OutboundPool
from reminders.engine import queue
from reminders.engine.clock import epoch_ms
from reminders.engine.scripts import Claimed
from reminders.handlers.timeout_jobs import Fired
from reminders.models import TimeoutJob
from reminders.runtime.quarantine import Quarantine
from reminders.timeout_topic_rules import TimeoutTopicSpec

logger = logging.getLogger(__name__)
# Waiting work per unit of concurrency: enough to keep every call busy, little enough that a
# job's wait stays well inside its visibility timeout (``timeout_topic_rules.VISIBILITY_CALLS``).
QUEUE_DEPTH = 2
BATCH_JOBS = 500  # jobs per celery task or callable call
SETTLE_MAX = 5000  # fired jobs settled per round of the settler
QUARANTINE_POLL_MS = 20  # how often held jobs that fell due look whether a suspect has settled
FIRE_THREAD_PREFIX = "fire-"  # the executors' threads, by name (``run_reminder_worker``'s exit)


FireBatch = Callable[[TimeoutTopicSpec, list[TimeoutJob], object], dict[int, str | None]]
# Settles what fired; returns how many were acked, retried and went dead.
Settle = Callable[[TimeoutTopicSpec, list[Fired]], dict[str, int]]
# Takes the rows of held entries that fell due: the (job, attempt) pairs to fire; it settles the
# rest in the engine itself (acked when refused, retried when the database failed).
Take = Callable[[TimeoutTopicSpec, int, list[Claimed]], list[tuple[TimeoutJob, int]]]
Clock = Callable[[], int]


class TopicExecutor:
    """One topic's executor in one worker: its pool of callers, its settler thread and, when
    it holds, its timer thread."""

    def __init__(
        self,
        spec: TimeoutTopicSpec,
        *,
        fire: FireBatch,
        settle: Settle,
        inline: bool = False,
        quarantine: Quarantine | None = None,
        on_room: Callable[[], None] | None = None,
        take: Take | None = None,
        clock: Clock = epoch_ms,
    ) -> None:
        self.spec = spec
        self.on_room = on_room  # called when a full batch fits again (wakes the dispatcher)
        self.quarantine = quarantine or Quarantine()
        self.inline = inline
        self._fire = fire
        self._settle = settle
        per_call = 1 if spec.type == "http" else BATCH_JOBS
        self.batch_size = spec.concurrency * per_call
        self.capacity = QUEUE_DEPTH * self.batch_size
        self._pool_http = OutboundPool(pool_size=spec.concurrency) if spec.type == "http" else None
        self._lock = threading.Condition()
        self._in_flight = 0
        # Of those in flight: fired and waiting for the settler. They hold no connection and wait
        # for no receiver, so they take no room (``room``) until there are a settler round's worth.
        self._settling = 0
        self.counts = {"acked": 0, "retried": 0, "dead": 0}
        self._fired: stdlib_queue.SimpleQueue[Fired | None] = stdlib_queue.SimpleQueue()
        self._pool: ThreadPoolExecutor | None = None
        self._settler: threading.Thread | None = None
        # Held entries: a heap of (due_ms, seq, slot, entry) and the newest seq of each job id
        # (an older heap item of the same job was replaced: skipped when it comes up).
        self._take = take
        self.clock = clock
        # How early jobs are claimed: at most a tenth of the visibility timeout, so an entry
        # held its whole time, and then as long again behind a suspect, is far from expiring.
        self.hold_ms = min(settings.TIMEOUT_HOLD_MS, spec.visibility_ms // 10)
        self._held_cv = threading.Condition()
        self._heap: list[tuple[int, int, int, Claimed]] = []
        self._held: dict[str, int] = {}
        self._seq = itertools.count()
        self._closing = False
        self._timer: threading.Thread | None = None
        if not inline:
            self._pool = ThreadPoolExecutor(
                spec.concurrency, thread_name_prefix=f"{FIRE_THREAD_PREFIX}{spec.name}"
            )
            self._settler = threading.Thread(
                target=self._settle_loop, name=f"settle-{spec.name}", daemon=True
            )
            self._settler.start()
            if take is not None:
                self._timer = threading.Thread(
                    target=self._hold_loop, name=f"hold-{spec.name}", daemon=True
                )
                self._timer.start()

    @property
    def holds(self) -> bool:
        """True when claimed entries may be handed over before they are due (``hold``)."""
        return self._timer is not None and self._timer.is_alive() and not self._closing

    # --- what the dispatch loop asks ----------------------------------------------------------

    def room(self) -> int:
        """How many more jobs may be handed on now (0: claim nothing of this topic)."""
        if self.quarantine.active:
            return 0
        with self._lock:
            return self._room()

    def _room(self) -> int:
        """Under ``_lock``: the capacity left beside what is held, waiting or firing; none while
        a settler round's worth of fired jobs waits to be settled (the settler is behind)."""
        if self._settling >= SETTLE_MAX:
            return 0
        return max(0, self.capacity - self._occupying())

    def _occupying(self) -> int:
        """Under ``_lock``: the jobs in flight that take room (all but those settling)."""
        return self._in_flight - self._settling

    @property
    def in_flight(self) -> int:
        with self._lock:
            return self._in_flight

    @property
    def occupying(self) -> int:
        """The jobs held, waiting for a call or firing (in flight and not settling)."""
        with self._lock:
            return self._occupying()

    def submit(
        self, slot: int, jobs: list[tuple[TimeoutJob, int]], *, suspect: bool = False
    ) -> None:
        """Fire ``(job, attempt)`` pairs taken from ``slot``; their results settle later.

        ``suspect``: the job came back because the process firing it died (a poison pill may
        kill its worker). It fires in quarantine: once nothing else of this process is in
        flight, and with no new work taken until it settled, so a pill takes nobody with it.
        """
        if not jobs:
            return
        with self._lock:
            self._in_flight += len(jobs)
        self._submit_counted(slot, jobs, suspect=suspect)

    def _submit_counted(
        self, slot: int, jobs: list[tuple[TimeoutJob, int]], *, suspect: bool
    ) -> None:
        if not jobs:
            return
        if self.inline:
            fired = self._run(slot, jobs)
            self._settle_safely(fired)
            return
        assert self._pool is not None
        if suspect:
            # Its own thread: it waits for what the others have in flight, which may be queued
            # in this pool behind it.
            self.quarantine.enter()
            threading.Thread(
                target=self._fire_quarantined,
                args=(slot, jobs),
                name=f"suspect-{self.spec.name}",
                daemon=True,
            ).start()
            return
        calls = [[pair] for pair in jobs] if self.spec.type == "http" else _chunks(jobs)
        for chunk in calls:
            self._pool.submit(self._fire_to_settler, slot, chunk)

    def hold(self, slot: int, entries: list[Claimed]) -> None:
        """Take over claimed entries whose rows are still untouched; each is taken and fired at
        its due time by the timer thread (at once when it is due already)."""
        if not entries:
            return
        replaced = 0
        with self._held_cv:
            for entry in entries:
                seq = next(self._seq)
                replaced += self._held.get(entry.job_id) is not None
                self._held[entry.job_id] = seq
                heapq.heappush(self._heap, (entry.due_ms, seq, slot, entry))
            self._held_cv.notify()
        with self._lock:
            self._in_flight += len(entries) - replaced

    def _firing(self) -> int:
        """In flight and not held (under ``_lock``; the held count is read without its lock)."""
        return self._in_flight - len(self._held)

    def firing(self) -> int:
        """How many jobs are in flight and not held (what a suspect waits for)."""
        with self._lock:
            return self._firing()

    def wait_firing(self, at_most: int, timeout_s: float) -> None:
        """Block until at most ``at_most`` jobs are firing, or ``timeout_s`` passed."""
        with self._lock:
            self._lock.wait_for(lambda: self._firing() <= at_most, timeout=timeout_s)

    def _hold_loop(self) -> None:
        while True:
            with self._held_cv:
                while True:
                    if not self._heap:
                        if self._closing:
                            return
                        self._held_cv.wait()
                        continue
                    wait_ms = self._heap[0][0] - self.clock()
                    if self.quarantine.active and wait_ms > -self.hold_ms:
                        # A suspect waiting to fire alone: what is held waits until it settled
                        # (and goes back to store if still held when it fires), but no longer
                        # than the hold past its due time.
                        wait_ms = max(wait_ms, QUARANTINE_POLL_MS)
                    elif wait_ms <= 0:
                        break
                    self._held_cv.wait(min(wait_ms / 1000, 1.0))
                due = self._pop_due(self.clock())
            for slot, entries in due.items():
                try:
                    self._release(slot, entries)
                except Exception:  # the timer must live on: give them back, due as they were
                    logger.exception(
                        "firing %d held jobs of %s failed", len(entries), self.spec.name
                    )
                    self._give_back(slot, entries)
            close_old_connections()

    def _give_back(self, slot: int, entries: list[Claimed]) -> None:
        """Held entries this executor will not fire go back to store, due as they were, their
        attempt not spent (left in flight, for the reaper, when Redis fails too)."""
        try:
            queue.unclaim(self.spec.name, slot, entries)
        except Exception:
            logger.exception(
                "giving back %d held jobs of %s failed (the reaper brings them back)",
                len(entries),
                self.spec.name,
            )

    def give_back_held(self, *, why: str = "at shutdown", level: int = logging.WARNING) -> None:
        """Everything still held goes back to store, due as it was (closing: the timer then
        ends; or a suspect about to fire alone)."""
        with self._held_cv:
            left = self._pop_due(float("inf"))
            self._heap.clear()
            self._held_cv.notify()
        for slot, entries in left.items():
            logger.log(
                level,
                "%d held jobs of %s given back %s, due as they were",
                len(entries),
                self.spec.name,
                why,
            )
            self._give_back(slot, entries)
            self._count_out(len(entries))

    def _pop_due(self, now_ms: float) -> dict[int, list[Claimed]]:
        """The held entries due by ``now_ms`` (replaced copies dropped), by slot; under the lock."""
        due: dict[int, list[Claimed]] = {}
        while self._heap and self._heap[0][0] <= now_ms:
            _, seq, slot, entry = heapq.heappop(self._heap)
            if self._held.get(entry.job_id) != seq:
                continue  # a newer claim of the same job replaced it
            del self._held[entry.job_id]
            due.setdefault(slot, []).append(entry)
        return due

    def _release(self, slot: int, entries: list[Claimed]) -> None:
        assert self._take is not None
        jobs: list[tuple[TimeoutJob, int]] = []
        try:
            jobs = self._take(self.spec, slot, entries)
        except Exception:  # left in flight: reaped after the visibility timeout, not lost
            logger.exception("taking %d held jobs of %s failed", len(entries), self.spec.name)
        self._count_out(len(entries) - len(jobs))
        try:
            self._submit_counted(slot, jobs, suspect=False)
        except RuntimeError:  # the pool was shut down under us (a close that gave up waiting)
            logger.warning(
                "%d taken jobs of %s not fired: the executor closed (reaped and "
                "fired again after their visibility timeout)",
                len(jobs),
                self.spec.name,
            )
            self._count_out(len(jobs))

    def _count_out(self, n: int) -> None:
        """``n`` entries left this executor: settled, or not fired (refused, replaced or
        failed); a full batch that fits again wakes the dispatcher (``on_room``)."""
        if n <= 0:
            return
        self._moved(in_flight=-n)

    def _moved(self, *, in_flight: int = 0, settling: int = 0) -> None:
        """Change the counts; a full batch that fits again wakes the dispatcher (``on_room``)."""
        with self._lock:
            was_full = self._room() < self.batch_size
            self._in_flight += in_flight
            self._settling += settling
            room_again = was_full and self._room() >= self.batch_size
            self._lock.notify_all()
        if room_again and self.on_room is not None:
            self.on_room()

    # --- firing ---------------------------------------------------------------------------------

    def _run(self, slot: int, jobs: list[tuple[TimeoutJob, int]]) -> list[Fired]:
        try:
            errors = self._fire(self.spec, [job for job, _ in jobs], self._pool_http)
        except Exception as exc:  # noqa: BLE001 - a failed call fails its jobs, retried
            error = f"{exc.__class__.__name__}: {exc}"[:500]
            errors = {job.pk: error for job, _ in jobs}
        now = epoch_ms()
        return [Fired(slot, job, attempt, errors.get(job.pk), now) for job, attempt in jobs]

    def _fire_to_settler(self, slot: int, jobs: list[tuple[TimeoutJob, int]]) -> None:
        try:
            fired_jobs = self._run(slot, jobs)
            # Counted before they are queued: the settler may take them at once.
            self._moved(settling=len(fired_jobs))
            for fired in fired_jobs:
                self._fired.put(fired)
        finally:
            close_old_connections()  # a callable may have used the database

    def _fire_quarantined(self, slot: int, jobs: list[tuple[TimeoutJob, int]]) -> None:
        try:
            self.quarantine.wait_alone(self, len(jobs))
            fired = self._run(slot, jobs)
            self._settle_safely(fired)
        finally:
            self.quarantine.leave()
            close_old_connections()
            if self.on_room is not None:  # claims may go on: what was given back is due
                self.on_room()

    # --- settling -------------------------------------------------------------------------------

    def _settle_loop(self) -> None:
        while True:
            first = self._fired.get()
            if first is None:
                return
            batch = [first]
            while len(batch) < SETTLE_MAX:
                try:
                    item = self._fired.get_nowait()
                except stdlib_queue.Empty:
                    break
                if item is None:
                    self._settle_safely(batch, queued=True)
                    return
                batch.append(item)
            self._settle_safely(batch, queued=True)

    def _settle_safely(self, fired: list[Fired], *, queued: bool = False) -> None:
        """Settle ``fired``; ``queued``: they came through the settler's queue (``_settling``)."""
        try:
            counts = self._settle(self.spec, fired)
            with self._lock:
                for name, n in counts.items():
                    self.counts[name] = self.counts.get(name, 0) + n
        except Exception:  # the entries stay in flight and are reaped and retried: not lost
            logger.exception("settling %d jobs of %s failed", len(fired), self.spec.name)
            close_old_connections()
        finally:
            self._moved(in_flight=-len(fired), settling=-len(fired) if queued else 0)

    # --- lifecycle ------------------------------------------------------------------------------

    def wait_idle(self, timeout_s: float) -> bool:
        """Block until nothing is in flight (True) or ``timeout_s`` passed (False)."""
        with self._lock:
            return self._lock.wait_for(lambda: self._in_flight == 0, timeout=timeout_s)

    def close(self, *, wait: bool = True) -> None:
        """Stop taking work; with ``wait``, fire what is held as it falls due (for as long as
        the look-ahead, in real time), then finish and settle what was handed on (what is left
        unsettled, or held, is reaped after its visibility timeout and fired again: not lost)."""
        if self._timer is not None:
            with self._held_cv:
                self._closing = True
                self._held_cv.notify()
            if not wait:
                self.give_back_held()
            self._timer.join(timeout=settings.TIMEOUT_HOLD_MS / 1000 + 1 if wait else 0)
            if self._timer.is_alive():  # the clock did not reach them: give them back
                self.give_back_held()
                self._timer.join(timeout=5)
        # What fires past its call's timeout (a callable that never returns) is not waited for:
        # its jobs stay in flight in Redis and are reaped and fired again, and the process
        # still stops (``run_reminder_worker`` leaves such threads behind).
        drained = self.wait_idle(self.spec.timeout_ms / 1000 * QUEUE_DEPTH + 5) if wait else False
        if wait and not drained:
            logger.warning(
                "%s: %d jobs still firing at close; left to the reaper",
                self.spec.name,
                self.in_flight,
            )
        if self._pool is not None:
            self._pool.shutdown(wait=drained, cancel_futures=not drained)
        if self._settler is not None:
            self._fired.put(None)
            if drained:
                self._settler.join(timeout=5)
        if self._pool_http is not None:
            self._pool_http.close()


def _chunks(jobs: list, size: int = BATCH_JOBS) -> list[list]:
    return [jobs[start : start + size] for start in range(0, len(jobs), size)]
