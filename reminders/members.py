"""Where a coupon reminder lives in the engine: its topic and its member string, written once.

A reminder's engine entry is its subscription id in base 36 (``"bkrfgg"`` for 700,000,000) in
slot ``crc32(user_id) & (slots - 1)`` (docs/reminders.md, Subscribe) of the topic of its
coupon's priority. Why so terse: Redis keeps each member in a string of its own beside the sorted
set's skiplist node and hash entry, and a member of up to six characters takes an 8-byte
allocation where a decimal id of up to twelve digits takes 16 and the long form
``"<subscription>:<user>:<coupon>"`` 32; a pending reminder then costs about 114 bytes of Redis
(``bench_backlog``). Everything else a reminder needs (user,
coupon, due time) is read from its row at delivery, which reads the row anyway.

The long form, ``"<subscription id>:<user id>:<coupon id>"`` in decimal (``legacy_member``),
still parses, so such an entry is delivered and shown like any other, and the dead-letter search
finds it under either form. Nothing else looks for it: a cancel or a move acts on the base-36
member only, and a long-form entry left behind is settled by its row when it fires and pruned by the
reconcile once its row is final (``services.indexing``).
"""

from __future__ import annotations

REMINDER_TOPIC = "coupon.reminder"
REMINDER_TOPIC_HIGH = "coupon.reminder.high"
# Reminders of high-priority coupons have their own topic, which workers drain first.
REMINDER_TOPICS = (REMINDER_TOPIC_HIGH, REMINDER_TOPIC)

_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"
# Every two-digit group, zero-padded: a member is built two digits a step (bulk indexing builds
# millions of them, and a digit a step would add a sixth to the rebuild's time).
_PAIRS = [a + b for a in _DIGITS for b in _DIGITS]
_PAIR = len(_PAIRS)  # 1296


def reminder_topic_for(priority: str) -> str:
    return REMINDER_TOPIC_HIGH if priority == "high" else REMINDER_TOPIC


def is_reminder_topic(topic: str) -> bool:
    return topic in REMINDER_TOPICS


def member(sub_id: int) -> str:
    """The member of subscription ``sub_id``: its id in base 36, lower case, no leading zeros."""
    if sub_id < 36:
        if sub_id < 0:
            raise ValueError("a subscription id is never negative")
        return _DIGITS[sub_id]
    text = _PAIRS[sub_id % _PAIR]
    sub_id //= _PAIR
    while sub_id:
        text = _PAIRS[sub_id % _PAIR] + text
        sub_id //= _PAIR
    return text.lstrip("0")


def legacy_member(sub_id: int, user_id: int, coupon_id: int) -> str:
    """The same subscription's member in the long form (see the module docstring)."""
    return f"{sub_id}:{user_id}:{coupon_id}"


def sub_id_of(value: str) -> int:
    """The subscription id of a member of either form; raises ``ValueError`` for anything else."""
    if ":" in value:
        head, _, rest = value.partition(":")
        user, _, coupon = rest.partition(":")
        if not (head.isdigit() and user.isdigit() and coupon.isdigit()):
            raise ValueError(f"not a reminder member: {value!r}")
        return int(head)
    if not value or not value.isalnum() or not value.isascii():
        raise ValueError(f"not a reminder member: {value!r}")
    return int(value, 36)


def try_sub_id_of(value: str) -> int | None:
    try:
        return sub_id_of(value)
    except ValueError:
        return None
