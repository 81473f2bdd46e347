"""The console's retention page (``/admin/console/retention/``): every retention setting, where
to change it, and the last run of each (``couponcenter.core.retention``; docs/retention.md).

Each app names its own retentions (``expiry.retention.RETENTIONS``,
``reminders.services.retention.RETENTIONS``); this page only reads them with the live settings
rows and the last runs kept in Redis.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.urls import reverse

from couponcenter.core.durations import iso_duration
from couponcenter.core.retention import retention_last_runs
from expiry import retention as expiry_retention
from expiry.services import expiry_settings_get
from reminders.selectors import reminder_settings_get
from reminders.services import retention as reminders_retention


@dataclass
class RetentionRow:
    name: str
    what: str
    process: str  # which process runs it
    setting: str  # "<Model>.<field>"
    value: timedelta
    edit_url: str
    last: dict[str, str]

    @property
    def value_text(self) -> str:
        return iso_duration(self.value) if self.value else "kept forever"

    @property
    def last_text(self) -> str:
        """ "12 removed in 0.31 s (delete)", or what kept it from running."""
        last = self.last
        if not last:
            return "never run"
        if last.get("way") == "kept":
            return "nothing removed (kept forever)"
        text = f"{int(last.get('removed') or 0):,} removed in {last.get('seconds', '?')} s"
        text += f" ({last.get('way', 'delete')})"
        if last.get("stopped") == "1":
            text += ", stopped before the end: the next run goes on"
        return text


def retention_rows() -> list[RetentionRow]:
    expiry_row = expiry_settings_get(max_age_s=0)
    reminders_row = reminder_settings_get(max_age_s=0)
    sources = [
        (
            expiry_retention.RETENTIONS,
            expiry_row,
            "expiry sweeper",
            reverse("admin:expiry_expirysettings_changelist"),
        ),
        (
            reminders_retention.RETENTIONS,
            reminders_row,
            "reminder worker",
            reverse("admin:reminders_remindersettings_changelist"),
        ),
    ]
    names = [name for retentions, *_ in sources for name, _, _ in retentions]
    last = retention_last_runs(names)
    return [
        RetentionRow(
            name=name,
            what=what,
            process=process,
            setting=f"{type(row).__name__}.{field}",
            value=getattr(row, field),
            edit_url=edit_url,
            last=last[name],
        )
        for retentions, row, process, edit_url in sources
        for name, field, what in retentions
    ]


def retention_page() -> dict:
    return {
        "rows": retention_rows(),
        "every_s": settings.RETENTION_EVERY_S,
        "batch_size": settings.RETENTION_BATCH_SIZE,
    }
