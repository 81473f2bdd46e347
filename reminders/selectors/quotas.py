"""Reads behind the tenant quotas (``services.quotas``): a topic's pending jobs, counted no
further than a limit, and who is near a limit now (the console).

The pending count walks the partial unique index of pending jobs
(``timeoutjob_one_pending_per_biz``, led by ``topic``) and stops at the limit: it costs what the
topic holds up to the limit, never more. The create path takes it once in a while and keeps it in
Redis in between (``services.quotas``), so no counter has to follow every way a job stops being
pending.
"""

from __future__ import annotations

from datetime import datetime
from typing import NamedTuple

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from reminders.engine import quotas
from reminders.engine.clock import epoch_ms
from reminders.models import ReminderSettings, TimeoutJob
from reminders.selectors.queues import ms_to_datetime
from reminders.selectors.timeout_topics import timeout_topic_specs

# "Near" a limit: at this share of it or more.
NEAR_SHARE = 0.8
PENDING = ReminderSettings._meta.get_field("quota_pending_per_topic").verbose_name
CREATIONS = ReminderSettings._meta.get_field("quota_creations_per_s").verbose_name
# Most owners the console lists as near their creations limit.
NEAR_LIST_MAX = 50


def timeout_pending_count(*, topic: str, at_most: int) -> int:
    """Pending jobs of ``topic``, counted up to ``at_most``."""
    if at_most <= 0:
        return 0
    return TimeoutJob.objects.filter(topic=topic, status=TimeoutJob.Status.PENDING)[
        :at_most
    ].count()


def is_near(used: int, limit: int) -> bool:
    return bool(limit) and used >= NEAR_SHARE * limit


class NearLimit(NamedTuple):
    quota: str  # the setting's verbose name
    who: str  # the owner (an account) or the topic and its owner
    used: int
    limit: int
    noted_at: datetime | None  # creations: when the owner was last seen near its limit

    @property
    def share_pct(self) -> int:
        return round(100 * self.used / self.limit) if self.limit else 0


def quota_near_limit(*, live: ReminderSettings) -> list[NearLimit]:
    """Topics whose pending jobs and owners whose creations per second are at ``NEAR_SHARE`` of
    their limit or past it (creations: noted within the last ``quotas.NEAR_KEEP_MS``). A topic's
    pending jobs are its kept count (what its quota sees), else counted up to the limit."""
    rows = []
    limit = live.quota_pending_per_topic
    if limit:
        # Only owned topics: the others are staff's, whom no quota bounds.
        specs = {name: s for name, s in timeout_topic_specs().items() if s.owned}
        wanted = {s.owner_group_id for s in specs.values() if s.owner_group_id}
        groups = dict(Group.objects.filter(pk__in=wanted).values_list("pk", "name"))
        users = _usernames({s.owner_user_id for s in specs.values() if s.owner_user_id})
        kept = quotas.pending_counts(list(specs))
        for name, spec in specs.items():
            used = kept[name]
            if used is None:
                used = timeout_pending_count(topic=name, at_most=limit)
            if is_near(used, limit):
                if spec.owner_user_id:
                    owner = f"user {users.get(spec.owner_user_id, spec.owner_user_id)}"
                elif spec.owner_group_id:
                    owner = f"group {groups.get(spec.owner_group_id, spec.owner_group_id)}"
                else:
                    owner = "shared"
                rows.append(NearLimit(PENDING, f"{name} ({owner})", used, limit, None))
    limit = live.quota_creations_per_s
    if limit:
        now = epoch_ms()
        noted = quotas.near(now_ms=now, limit=NEAR_LIST_MAX)
        levels = quotas.levels([owner for owner, _ in noted], limit_per_s=limit, now_ms=now)
        users = _usernames({int(owner) for owner, _ in noted if owner.isdigit()})
        for owner, at in noted:
            who = users.get(int(owner), owner) if owner.isdigit() else owner
            rows.append(
                NearLimit(CREATIONS, f"account {who}", levels[owner], limit, ms_to_datetime(at))
            )
    return rows


def _usernames(pks: set[int]) -> dict[int, str]:
    if not pks:
        return {}
    return dict(get_user_model().objects.filter(pk__in=pks).values_list("pk", "username"))
