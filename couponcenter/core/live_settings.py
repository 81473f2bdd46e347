"""The one scheme for live configuration: a single settings row with a change marker.

As django-celery-beat's "changed at" row: every save of a settings row goes through
``live_settings_save``, which bumps the row's ``version`` (a ``queryset.update()`` elsewhere must
bump it too). Readers (``LiveSettingsReader``) keep the row for a short time; after that they read
only ``(pk, version, updated_at)`` and reload the row when the marker moved, so a worker polling
every tick costs one narrow query and an operator's edit applies within one poll, without a
restart. The marker read is ``(pk, version, updated_at)``, so a row recreated or restored under a
version seen before is read again too.

Configuration kept in other tables (an app's rows that its requests validate against) follows the
marker of its app's settings row: each write of it moves that marker in its own transaction
(``live_settings_touch``), and each process keeps what it read for as long as the marker stays
(``MarkedCache``). No TTL of its own: it is exactly as fresh as the marker check.

Read your own writes: a request (``as_of_now``, entered for every request by
``core.middleware.LiveSettingsAsOfRequestMiddleware``) checks each marker it touches once, after it
began, so it never refuses what was committed before it started, whichever process served the
write; the check is one narrow query per marker and request. Outside a request (workers) the
reader's ``max_age_s`` is the bound.

The models hold the bounds (validators, ``clean()``), so the admin and the API refuse the same
values. A row that is invalid all the same (written behind the services' back) is reported once
per version and skipped: readers keep the last good row (or the defaults), so a bad value never
crashes a worker; its marker is still followed, so what follows it stays current.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Generic, TypeVar

from django.core.exceptions import ValidationError
from django.db import connection, models, transaction
from django.db.models import F
from django.utils import timezone

logger = logging.getLogger(__name__)
# The monotonic time from which a marker check counts for the current context (a request): one
# made before it is checked again. Outside ``as_of_now``, any check counts (within ``max_age_s``).
_as_of: ContextVar[float] = ContextVar("live_settings_as_of", default=float("-inf"))
Marker = tuple  # (pk, *MARKER_FIELDS) of a settings row, as the database gives them
MARKER_FIELDS = ("version", "updated_at")


@contextmanager
def as_of_now() -> Iterator[None]:
    """Inside, every reader checks its marker (once) before it trusts what it keeps."""
    token = _as_of.set(time.monotonic())
    try:
        yield
    finally:
        _as_of.reset(token)


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
        self._marker: Marker | None = None  # as last read, whatever became of the row
        self._checked = float("-inf")  # when the last marker read began
        # The marker of a row found invalid, reported once: a row restored or recreated later
        # under the same version is read again.
        self._refused: Marker | None = None
        meta, quote = model._meta, connection.ops.quote_name
        pk = quote(meta.pk.column)
        columns = ", ".join(quote(meta.get_field(name).column) for name in MARKER_FIELDS)
        # Raw: the ORM takes longer to compile this query than the database to answer it, and
        # it runs once per request. Markers are only compared with each other, as read.
        self._marker_sql = (
            f"SELECT {pk}, {columns} FROM {quote(meta.db_table)} ORDER BY {pk} LIMIT 1"
        )

    def get(self, *, max_age_s: float | None = None) -> S:
        """The row as of at most ``max_age_s`` seconds ago (0: check the marker now)."""
        return self._current(max_age_s)[0]

    def marker(self, *, max_age_s: float | None = None) -> Marker | None:
        """The row's change marker, checked as ``get`` checks it."""
        return self._current(max_age_s)[1]

    def _current(self, max_age_s: float | None) -> tuple[S, Marker | None]:
        max_age_s = self.max_age_s if max_age_s is None else max_age_s
        with self._lock:  # the row and the marker it was kept under, as one pair
            row, seen, checked = self._row, self._marker, self._checked
        if row is not None and checked >= _as_of.get() and time.monotonic() - checked < max_age_s:
            return row, seen
        began = time.monotonic()
        with connection.cursor() as cursor:
            cursor.execute(self._marker_sql)
            marker = cursor.fetchone()
        # Compared with the marker our row was kept under, not with what another thread stored
        # meanwhile: storing our older row under its newer marker would keep that row for good.
        if marker is None or row is None or marker != seen:
            if marker is not None and marker == self._refused:
                row = row if row is not None else self.model(pk=marker[0])  # none was good
            else:
                row = self._load(row, marker)
        with self._lock:
            if began >= self._checked:  # else a read that began later stored a newer pair
                self._row, self._marker, self._checked = row, marker, began
        return row, marker

    def recheck(self) -> None:
        """Read the marker again at the next use (a write this process made moved it), keeping
        the row, and so the last good one when the row is found invalid."""
        with self._lock:
            self._checked = float("-inf")

    def _load(self, last_good: S | None, marker: Marker | None) -> S:
        loaded = self.model.objects.order_by("pk").first()
        if loaded is None:
            loaded, _ = self.model.objects.get_or_create(pk=1)
        try:
            loaded.full_clean()
        except ValidationError as exc:
            self._refused = marker
            logger.error(
                "%s version %s is invalid, keeping the last good settings: %s",
                self.model.__name__,
                loaded.version,
                exc.message_dict,
            )
            return last_good if last_good is not None else self.model(pk=loaded.pk)
        return loaded

    def clear(self) -> None:
        with self._lock:
            self._row, self._marker = None, None
            self._checked, self._refused = float("-inf"), None


V = TypeVar("V")


class MarkedCache(Generic[V]):
    """A value read from other tables whose every write moves a settings row's marker
    (``live_settings_touch``), kept while that marker stays: ``marker`` is the reader's (its
    ``LiveSettingsReader.marker``), so the value is checked exactly as often as the row is."""

    def __init__(self, *, marker: Callable[[], Marker], load: Callable[[], V]) -> None:
        self._marker = marker
        self._load = load
        self._kept: tuple[Marker, V] | None = None

    def get(self) -> V:
        marker = self._marker()
        kept = self._kept
        if kept is not None and kept[0] == marker:
            return kept[1]
        # Loaded after the marker was read: at least as new as the marker says.
        value = self._load()
        self._kept = (marker, value)
        return value


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


def live_settings_touch(*, model: type[LiveSettings]) -> None:
    """Move the change marker of ``model``'s row without changing its values: call it in the
    transaction of a write to configuration kept in other tables (``MarkedCache``), so the marker
    commits with it. The row is created with its defaults if there is none yet. ``updated_at``
    moves too, so a marker never repeats one seen in a transaction that rolled back."""
    with transaction.atomic():
        moved = model.objects.update(version=F("version") + 1, updated_at=timezone.now())
        if not moved:
            model.objects.get_or_create(pk=1)
