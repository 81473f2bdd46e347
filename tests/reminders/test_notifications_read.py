"""Marking the inbox read: one notification or all of them, only the user's own and only what
is visible (a pre-staged reminder is not the user's to read yet)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from reminders.models import Notification
from tests.support.factories import api_user

pytestmark = pytest.mark.django_db
USER, OTHER = 5100, 5200


@pytest.fixture
def me(client):
    _, token = api_user(end_user_id=USER)
    client.defaults["HTTP_AUTHORIZATION"] = f"Token {token}"
    return client


def _note(user_id: int, key: str, *, visible_in: timedelta = timedelta(0)) -> Notification:
    return Notification.objects.create(user_id=user_id, dedup_key=key, title=key,
                                       visible_at=timezone.now() + visible_in)  # fmt: skip


def _read_at(note: Notification):
    return Notification.objects.get(pk=note.pk).read_at


def test_mark_one_read_is_idempotent(me):
    note = _note(USER, "a")
    first = me.post(f"/api/users/{USER}/notifications/{note.pk}/read/")
    assert first.status_code == 200, first.content
    assert first.json()["id"] == note.pk and first.json()["read_at"]
    stamped = _read_at(note)
    again = me.post(f"/api/users/{USER}/notifications/{note.pk}/read/")
    assert again.status_code == 200
    assert _read_at(note) == stamped  # the first read_at stays


def test_another_users_or_a_hidden_notification_is_a_404_and_stays_unread(me):
    theirs = _note(OTHER, "theirs")
    staged = _note(USER, "staged", visible_in=timedelta(minutes=5))
    for note in (theirs, staged):
        response = me.post(f"/api/users/{USER}/notifications/{note.pk}/read/")
        assert response.status_code == 404
        assert "detail" in response.json()
        assert _read_at(note) is None
    assert me.post(f"/api/users/{OTHER}/notifications/{theirs.pk}/read/").status_code == 403


def test_mark_all_read_touches_only_the_users_visible_unread(me):
    mine = [_note(USER, f"m{i}") for i in range(3)]
    earlier = _note(USER, "earlier")
    me.post(f"/api/users/{USER}/notifications/{earlier.pk}/read/")
    stamped = _read_at(earlier)
    staged = _note(USER, "staged", visible_in=timedelta(minutes=5))
    theirs = _note(OTHER, "theirs")
    response = me.post(f"/api/users/{USER}/notifications/read/")
    assert response.status_code == 200, response.content
    assert response.json()["marked"] == 3
    assert all(_read_at(n) is not None for n in mine)
    assert _read_at(earlier) == stamped
    assert _read_at(staged) is None and _read_at(theirs) is None


def test_the_inbox_can_list_only_unread(me):
    read, unread = _note(USER, "read"), _note(USER, "unread")
    me.post(f"/api/users/{USER}/notifications/{read.pk}/read/")
    listed = me.get(f"/api/users/{USER}/notifications/", {"unread": "true"}).json()
    assert [n["id"] for n in listed["results"]] == [unread.pk]
    assert me.get(f"/api/users/{USER}/notifications/", {"unread": "maybe"}).status_code == 400
