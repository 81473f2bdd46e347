"""The one scheme for live configuration: a single settings row with a change marker.

As django-celery-beat's "changed at" row: every save of a settings row goes through
``live_settings_save``, which bumps the row's ``version`` (a ``queryset.update()`` elsewhere must
bump it too). Readers (``LiveSettingsReader``) keep the row for a short time; after that they read
only ``(pk, version)`` and reload the row when the marker moved, so a worker polling every tick
costs one narrow query and an operator's edit applies within one poll, without a restart. The
marker read is ``(pk, version, updated_at)``, so a row recreated or restored under a version seen
before is read again too.

The models hold the bounds (validators, ``clean()``), so the admin and the API refuse the same
values. A row that is invalid all the same (written behind the services' back) is reported once
per version and skipped: readers keep the last good row (or the defaults), so a bad value never
crashes a worker.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Generic, TypeVar

from django.core.exceptions import ValidationError
from django.db import models, transaction
from django.db.models import F

logger = logging.getLogger(__name__)


class LiveSettings(models.Model):
    """Abstract base of a single-row settings model that workers poll."""

    version = models.PositiveIntegerField(default=1, editable=False)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        abstract = True


S = TypeVar("S", bound=LiveSettings)


class LiveSettingsReader(Generic[S]):
    """The settings row of ``model`` (created with its defaults on first use), per process."""

    def __init__(self, model: type[S], *, max_age_s: float) -> None:
        self.model = model
        self.max_age_s = max_age_s
        self._lock = threading.Lock()
        self._row: S | None = None
        self._checked = float("-inf")
        # The (pk, version, updated_at) found invalid, reported once: a row restored or recreated
        # later under the same version is read again.
        self._refused: tuple | None = None

    def get(self, *, max_age_s: float | None = None) -> S:
        """The row as of at most ``max_age_s`` seconds ago (0: check the marker now)."""
        max_age_s = self.max_age_s if max_age_s is None else max_age_s
        row = self._row
        if row is not None and time.monotonic() - self._checked < max_age_s:
            return row
        marker = (
            self.model.objects.order_by("pk").values_list("pk", "version", "updated_at").first()
        )
        if marker is None or (
            marker != self._refused
            and (row is None or marker != (row.pk, row.version, row.updated_at))
        ):
            row = self._load(row)
        elif row is None:  # the stored row is invalid and no good one was ever read
            row = self.model(pk=marker[0])
        with self._lock:
            self._row, self._checked = row, time.monotonic()
        return row

    def _load(self, last_good: S | None) -> S:
        loaded = self.model.objects.order_by("pk").first()
        if loaded is None:
            loaded, _ = self.model.objects.get_or_create(pk=1)
        try:
            loaded.full_clean()
        except ValidationError as exc:
            self._refused = (loaded.pk, loaded.version, loaded.updated_at)
            logger.error(
                "%s version %s is invalid, keeping the last good settings: %s",
                self.model.__name__, loaded.version, exc.message_dict,
            )  # fmt: skip
            return last_good if last_good is not None else self.model(pk=loaded.pk)
        return loaded

    def clear(self) -> None:
        with self._lock:
            self._row, self._checked, self._refused = None, float("-inf"), None


def live_settings_save(*, instance: S) -> S:
    """Validate and save the row, and move its change marker. Raises ``ValidationError`` (nothing
    saved) or ``ValueError`` when a second row would be created."""
    instance.full_clean()
    model = type(instance)
    with transaction.atomic():
        if instance.pk is None and model.objects.exists():
            raise ValueError(f"there is only one {model.__name__} row; change it instead")
        instance.save()
        model.objects.filter(pk=instance.pk).update(version=F("version") + 1)
        instance.refresh_from_db()
    return instance
