"""Reads of the engine's dead queues for the console's dead-letter pages and ``/api/ops/``.

Bounded like every console read: dead letters are read a page at a time (ZREVRANGE with a LIMIT),
searched by resolving the id to its slot (from the database row, or from the user id's slot under
every layout) and scanning only that slot's dead set.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import Q

from couponcenter.core.redis import get_redis
from reminders.engine import keys, queue, scripts
from reminders.members import (
    REMINDER_TOPICS,
    is_reminder_topic,
    legacy_member,
    member,
    try_sub_id_of,
)
from reminders.models import DeadLetter, ReminderSubscription, TimeoutJob
from reminders.selectors.queues import ms_to_datetime, topic_slot_counts

DEAD_PAGE_MAX_OFFSET = 10_000  # deeper pages of the dead list would read too much per slot
SEARCH_SCAN_COUNT = 1000
ERROR_SEARCH_PER_SLOT = 2000  # newest dead letters per slot an error-text search reads
SEARCH_SUBSCRIPTIONS = 1000  # a user's subscriptions a search by user id looks up


def dead_letter_key(topic: str, slot: int, job_id: str) -> str:
    return f"{topic}|{slot}|{job_id}"


def parse_dead_letter_key(value: str) -> tuple[str, int, str]:
    topic, slot, job_id = value.split("|", 2)
    return topic, int(slot), job_id


def _letter(topic: str, slot: int, entry: queue.DeadEntry) -> DeadLetter:
    return DeadLetter(
        key=dead_letter_key(topic, slot, entry.job_id),
        topic=topic,
        slot=slot,
        job_id=entry.job_id,
        attempts=entry.attempts,
        last_error=entry.last_error,
        died_at=ms_to_datetime(entry.died_ms),
    )


def _with_rows(letters: list[DeadLetter]) -> list[DeadLetter]:
    """Each letter's row and business key, in one query per kind for the page: a reminder's
    subscription (its end user and coupon: a member names only the row), a timeout job's
    ``type:id``. Sets ``user_id``, ``business_key`` and ``row`` (("subscription" or "job",
    pk), or None when the row is gone)."""
    sub_of, job_of = {}, {}
    for letter in letters:
        if is_reminder_topic(letter.topic):
            sub_of[letter.key] = try_sub_id_of(letter.job_id)
        elif letter.job_id.isdigit():
            job_of[letter.key] = int(letter.job_id)
    subs_wanted = {sub for sub in sub_of.values() if sub is not None}
    subs = {
        pk: (user_id, coupon_id)
        for pk, user_id, coupon_id in ReminderSubscription.objects.filter(
            pk__in=subs_wanted
        ).values_list("pk", "user_id", "coupon_id")
    }
    jobs = {
        pk: f"{biz_type}:{biz_id}"
        for pk, biz_type, biz_id in TimeoutJob.objects.filter(
            pk__in=set(job_of.values())
        ).values_list("pk", "biz_type", "biz_id")
    }
    for letter in letters:
        letter.business_key, letter.row = "", None
        if (sub := sub_of.get(letter.key)) in subs:
            letter.user_id, coupon_id = subs[sub]
            letter.business_key = f"coupon {coupon_id}, user {letter.user_id}"
            letter.row = ("subscription", sub)
        elif (job := job_of.get(letter.key)) in jobs:
            letter.business_key = jobs[job]
            letter.row = ("job", job)
    return letters


@dataclass
class DeadPage:
    letters: list[DeadLetter]
    total: int  # entries matching the topic/slot filter (exact for those, ignoring the search)
    has_more: bool


def dead_counts(*, topic: str | None = None) -> dict[str, list[int]]:
    """Per topic, the dead count of each slot (one pipeline per topic)."""
    return {
        name: [s.dead for s in queue.stats(name, range(slots), now_ms=0)]
        for name, slots in topic_slot_counts().items()
        if topic is None or name == topic
    }


def dead_letter_list(
    *,
    topic: str | None = None,
    slot: int | None = None,
    search: str = "",
    offset: int = 0,
    limit: int = 100,
) -> DeadPage:
    """A page of dead letters, most recent first, filtered by topic, slot and a job or user id."""
    counts = dead_counts(topic=topic)
    pairs = [
        (name, s)
        for name, per_slot in counts.items()
        for s, n in enumerate(per_slot)
        if n and (slot is None or s == slot)
    ]
    total = sum(counts[name][s] for name, s in pairs)
    if search.strip():
        found = dead_letter_search(search.strip(), pairs=pairs)
        return DeadPage(found[offset : offset + limit], len(found), len(found) > offset + limit)
    offset = min(max(offset, 0), DEAD_PAGE_MAX_OFFSET)
    # Each slot is sorted by death time: the page is among the first offset + limit of each.
    merged = [
        _letter(name, s, entry)
        for name, s in pairs
        for entry in queue.list_dead(name, s, limit=offset + limit)
    ]
    merged.sort(key=lambda d: (d.died_at, d.key), reverse=True)
    return DeadPage(_with_rows(merged[offset : offset + limit]), total, total > offset + limit)


def dead_letter_search(term: str, *, pairs: list[tuple[str, int]]) -> list[DeadLetter]:
    """Dead letters whose job id (or subscription id) or end-user id is ``term``, whose business
    key is ``term`` (``order:123``), or whose last error contains the text after ``error:``
    (the newest ``ERROR_SEARCH_PER_SLOT`` of each slot are read)."""
    wanted = set(pairs)
    topics = {name for name, _ in pairs}
    candidates: dict[tuple[str, int], set[str]] = {}

    def add(topic: str, slot: int, job_id: str) -> None:
        if (topic, slot) in wanted:
            candidates.setdefault((topic, slot), set()).add(job_id)

    if term.lower().startswith("error:"):
        text = term[len("error:") :].strip().lower()
        for name, s in pairs:
            for entry in queue.list_dead(name, s, limit=ERROR_SEARCH_PER_SLOT):
                if text and text in (entry.last_error or "").lower():
                    add(name, s, entry.job_id)
        return _dead_entries(candidates)
    if term.count(":") == 1:  # a timeout job's business key, type:id
        biz_type, _, biz_id = term.partition(":")
        jobs = TimeoutJob.objects.filter(biz_type=biz_type, biz_id=biz_id, topic__in=topics)
        for job in jobs.values("pk", "topic", "slot")[:100]:
            add(job["topic"], job["slot"], str(job["pk"]))
    reminders = topics & set(REMINDER_TOPICS)
    if term.count(":") == 2:  # a whole reminder member in the long form
        for name, s in pairs:
            if is_reminder_topic(name):
                add(name, s, term)
    if reminders and term.isalnum() and term.isascii():
        # A reminder member as the engine holds it (base 36), copied from the list: one made of
        # digits only ("123" is subscription 1371) is tried as a member too.
        for name, s in pairs:
            if is_reminder_topic(name):
                add(name, s, term.lower())
    if term.isdigit() and len(term) <= 18:
        number = int(term)
        # The subscription with this id, and the user with this id's subscriptions.
        subs = ReminderSubscription.objects.filter(Q(pk=number) | Q(user_id=number))
        for sub in subs.values("pk", "user_id", "coupon_id", "slot")[:SEARCH_SUBSCRIPTIONS]:
            for name in reminders:
                add(name, sub["slot"], member(sub["pk"]))
                add(name, sub["slot"], legacy_member(sub["pk"], sub["user_id"], sub["coupon_id"]))
        for job in TimeoutJob.objects.filter(pk=number).values("pk", "topic", "slot"):
            add(job["topic"], job["slot"], str(job["pk"]))
        for name in reminders:  # long-form members name their user
            for s in {keys.slot_for(number, n) for n in queue.slot_layouts(name)}:
                for job_id in _scan_dead(name, s, f"*:{number}:*"):
                    add(name, s, job_id)
    return _dead_entries(candidates)


def _scan_dead(topic: str, slot: int, pattern: str) -> list[str]:
    dead = keys.slot_keys(topic, slot).dead
    client = get_redis()
    return [
        scripts.as_str(member)
        for member, _ in client.zscan_iter(dead, match=pattern, count=SEARCH_SCAN_COUNT)
    ]


def _dead_entries(candidates: dict[tuple[str, int], set[str]]) -> list[DeadLetter]:
    """The candidates that really are dead, with their meta, most recent first."""
    groups = [(topic, slot, sorted(ids)) for (topic, slot), ids in candidates.items()]
    pipe = scripts.pipeline(get_redis())
    for topic, slot, ids in groups:
        k = keys.slot_keys(topic, slot)
        pipe.zmscore(k.dead, ids)
        pipe.hmget(k.meta, [f for i in ids for f in (f"a:{i}", f"e:{i}")])
    raw = pipe.execute() if groups else []
    out = []
    for g, (topic, slot, ids) in enumerate(groups):
        scores, meta = raw[2 * g], raw[2 * g + 1]
        for n, (job_id, score) in enumerate(zip(ids, scores, strict=True)):
            if score is None:
                continue
            entry = queue.DeadEntry(
                job_id, int(score), int(meta[2 * n] or 0), scripts.as_str(meta[2 * n + 1] or b"")
            )
            out.append(_letter(topic, slot, entry))
    out.sort(key=lambda d: (d.died_at, d.key), reverse=True)
    return _with_rows(out)


def dead_letters_get(letter_keys: list[str]) -> list[DeadLetter]:
    """The given dead letters (``topic|slot|job id`` keys) that are still dead."""
    candidates: dict[tuple[str, int], set[str]] = {}
    known = topic_slot_counts()
    for value in letter_keys:
        try:
            topic, slot, job_id = parse_dead_letter_key(value)
        except ValueError:
            continue
        if topic in known and 0 <= slot < known[topic]:
            candidates.setdefault((topic, slot), set()).add(job_id)
    return _dead_entries(candidates)


def dead_matching_count(*, topic: str, slot: int | None = None) -> int:
    counts = dead_counts(topic=topic).get(topic, [])
    return sum(n for s, n in enumerate(counts) if slot is None or s == slot)
