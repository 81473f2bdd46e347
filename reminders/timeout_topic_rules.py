"""A generic timeout topic's spec, its knobs, and the rules every spec must keep (shared by the
``TimeoutTopic`` model's ``clean()``, the settings loader and the workers).

Each knob is defined once (``reminders.engine.knobs``); the spec's defaults, the model's fields,
the admin's fieldsets and the API's fields are derived from ``TIMEOUT_TOPIC_KNOBS``."""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import datetime
from urllib.parse import urlsplit

from django.conf import settings
from django.utils.crypto import salted_hmac

from couponcenter.core import webhooks
from couponcenter.core.webhooks import secret_problem
from reminders.engine.knobs import (
    BACKOFF_BASE_MS,
    BACKOFF_CAP_MS,
    MAX_ATTEMPTS,
    SLOTS,
    TOPIC_KNOBS,
    VISIBILITY_MS,
    Knob,
    is_power_of_two,
    knob_values,
)
from reminders.members import REMINDER_TOPICS

TOPIC_TYPES = {"log", "callable", "celery", "http"}
# Keeps the fair-key hash apart from every other use of the secret key.
FAIR_KEY_SALT = "reminders.fair_key"
# A job may wait in its topic's executor for (queue depth / concurrency) calls before its own:
# the visibility timeout must cover that many call timeouts, or a slow receiver's jobs would be
# taken back and retried while they still wait their turn.
VISIBILITY_CALLS = 4

# How each worker's executor fires a topic's jobs (the engine's knobs are ``TOPIC_KNOBS``).
CONCURRENCY = Knob(
    "concurrency",
    default=8,
    low=1,
    high=256,
    help="Jobs (http) or batches fired at once by each worker.",
)
TIMEOUT_MS = Knob(
    "timeout_ms",
    default=5_000,
    low=100,
    high=120_000,
    help="How long one call may take before it counts as failed.",
)
RATE_LIMIT_PER_S = Knob(
    "rate_limit_per_s",
    default=0,
    low=0,
    high=1_000_000,
    help="Jobs fired per second across all workers (0: no limit).",
)
FIRING_KNOBS = (CONCURRENCY, TIMEOUT_MS, RATE_LIMIT_PER_S)
TIMEOUT_TOPIC_KNOBS = (*TOPIC_KNOBS, *FIRING_KNOBS)


@dataclass(frozen=True)
class TimeoutTopicSpec:
    name: str
    type: str
    slots: int = SLOTS.default
    max_attempts: int = MAX_ATTEMPTS.default
    visibility_ms: int = VISIBILITY_MS.default
    backoff_base_ms: int = BACKOFF_BASE_MS.default
    backoff_cap_ms: int = BACKOFF_CAP_MS.default
    path: str = ""
    task: str = ""
    url: str = ""
    secret: str = ""
    # The secret being rotated out: it signs every call too, until ``previous_secret_until``
    # (None: until it is removed, as a topic in settings does).
    previous_secret: str = ""
    previous_secret_until: datetime | None = None
    # Our older X-Coupon-Center-* signature headers as well (docs/timeouts.md, "Signatures").
    legacy_signature: bool = False
    allow_http: bool = False
    concurrency: int = CONCURRENCY.default
    timeout_ms: int = TIMEOUT_MS.default
    rate_limit_per_s: int = RATE_LIMIT_PER_S.default
    fair_key: str = ""  # "", "biz_type" or "attribute.<name>"
    paused: bool = False
    owner_user_id: int | None = None
    owner_group_id: int | None = None
    read_only: bool = True  # from settings; False: a TimeoutTopic row

    @property
    def target(self) -> str:
        return {"http": self.url, "celery": self.task, "callable": self.path}.get(self.type, "")

    @property
    def owned(self) -> bool:
        return self.owner_user_id is not None or self.owner_group_id is not None

    def signing_secrets(self, now: datetime) -> tuple[str, ...]:
        """The secrets a call made at ``now`` is signed with, the current one first."""
        rotating = self.previous_secret and (
            self.previous_secret_until is None or now < self.previous_secret_until
        )
        return (self.secret, self.previous_secret) if rotating else (self.secret,)


# A topic in settings ends a rotation by dropping its previous_secret: it has no end time.
SETTINGS_KEYS = {f.name for f in fields(TimeoutTopicSpec)} - {
    "name",
    "read_only",
    "previous_secret_until",
}


def spec_problems(spec: TimeoutTopicSpec, *, secret_what: str = "the secret") -> dict[str, str]:
    """What is wrong with ``spec``, by field (empty: nothing)."""
    problems: dict[str, str] = {}
    if spec.type not in TOPIC_TYPES:
        problems["type"] = f"must be one of {sorted(TOPIC_TYPES)}"
    if spec.name in REMINDER_TOPICS:
        problems["name"] = f"{spec.name} is built in"
    if not is_power_of_two(spec.slots):
        problems["slots"] = "must be a power of two (1, 2, 4, ...)"
    if spec.type == "http":
        scheme = urlsplit(spec.url).scheme.lower()
        if scheme not in ("http", "https") or not urlsplit(spec.url).hostname:
            problems["target"] = "an http topic needs an https:// URL"
        elif (
            scheme == "http"
            and not webhooks.plain_http_allowed(allow_http=spec.allow_http)
            and spec.read_only is False
        ):
            problems["target"] = (
                "plain-HTTP URL refused: use https://, allow plain HTTP on this topic "
                "(allow_http) or everywhere (WEBHOOK_ALLOW_HTTP=1)"
            )
        problem = secret_problem(spec.secret, what=secret_what)
        if problem:
            problems["secret"] = problem
        problem = spec.previous_secret and secret_problem(
            spec.previous_secret, what=f"{secret_what} being rotated out (previous_secret)"
        )
        if problem:
            problems["previous_secret"] = problem
    elif spec.type in ("celery", "callable") and not spec.target:
        what = "task name" if spec.type == "celery" else "dotted path"
        problems["target"] = f"a {spec.type} topic needs its {what}"
    elif (
        spec.type == "callable"
        and spec.read_only is False
        and spec.path not in settings.TIMEOUT_CALLABLE_TARGETS
    ):
        # A topic kept as data names its function from the admin or the API: only the
        # operator's list may be called, never any importable function.
        problems["target"] = (
            f"{spec.path!r} is not in settings.TIMEOUT_CALLABLE_TARGETS, the functions a "
            "callable topic may call"
        )
    least = VISIBILITY_CALLS * spec.timeout_ms
    if spec.type == "http" and spec.visibility_ms < least:
        problems["visibility_ms"] = (
            f"must be at least {VISIBILITY_CALLS} x the timeout ({least} ms): a job may wait "
            "for calls ahead of it in the executor"
        )
    if spec.backoff_cap_ms < spec.backoff_base_ms:
        problems["backoff_cap_ms"] = "must not be below the base backoff"
    return problems


def spec_from_topic(row) -> TimeoutTopicSpec:
    """The spec of a ``TimeoutTopic`` row (unsaved rows too, for validation)."""
    target_field = {"http": "url", "celery": "task", "callable": "path"}.get(row.type)
    return TimeoutTopicSpec(
        name=row.name,
        type=row.type,
        secret=row.secret,
        previous_secret=row.previous_secret,
        previous_secret_until=row.previous_secret_until,
        legacy_signature=row.legacy_signature,
        allow_http=row.allow_http,
        fair_key=row.fair_key,
        paused=row.paused,
        owner_user_id=row.owner_user_id,
        owner_group_id=row.owner_group_id,
        read_only=False,
        **knob_values(row, TIMEOUT_TOPIC_KNOBS),
        **({target_field: row.target} if target_field else {}),
    )


def slot_basis(
    spec: TimeoutTopicSpec,
    biz_type: str,
    biz_id: str,
    attribute: dict | None,
    *,
    owner_id: int | None,
) -> str:
    """What a job's slot is chosen by: its business id, or with ``fair_key`` the key's value,
    so each key's jobs share a slot and the claims' round-robin over slots shares the firing
    between keys: one flooding key fills only its own slot (keys that hash to the same slot
    share it; more slots, fewer collisions).

    The value is the client's to choose, so it counts only within the account that creates the
    job (``owner_id``; None: staff and code): another account's same value is another key. It
    is hashed with the service's secret key, so no account can work out a value that lands in
    the slot of another's key either."""
    if spec.fair_key == "biz_type":
        value = biz_type
    elif spec.fair_key.startswith("attribute."):
        value = (attribute or {}).get(spec.fair_key.removeprefix("attribute."), "")
    else:
        return biz_id
    key = f"{'' if owner_id is None else owner_id}:{value}"
    return "fair:" + salted_hmac(FAIR_KEY_SALT, key, algorithm="sha256").hexdigest()[:16]
