"""Where a coupon reminder lives in the engine: its topic and its member string, written once.

A reminder's engine entry is the member ``"<subscription id>:<user id>:<coupon id>"`` in slot
``crc32(user_id) & (slots - 1)`` (article 000's ``userId % queueCount``) of the topic of its
coupon's priority. The dispatcher reads the coupon id and delivery the subscription id of
200,000 members in a burst, so those two have their own cheap accessors.
"""

from __future__ import annotations

from typing import NamedTuple

REMINDER_TOPIC = "coupon.reminder"
REMINDER_TOPIC_HIGH = "coupon.reminder.high"
# Reminders of high-priority coupons have their own topic, which workers drain first.
REMINDER_TOPICS = (REMINDER_TOPIC_HIGH, REMINDER_TOPIC)


def reminder_topic_for(priority: str) -> str:
    return REMINDER_TOPIC_HIGH if priority == "high" else REMINDER_TOPIC


def is_reminder_topic(topic: str) -> bool:
    return topic in REMINDER_TOPICS


class ReminderMember(NamedTuple):
    sub_id: int
    user_id: int
    coupon_id: int

    def __str__(self) -> str:
        return member(self.sub_id, self.user_id, self.coupon_id)

    @classmethod
    def parse(cls, value: str) -> ReminderMember:
        """Raises ``ValueError`` for anything but three integers."""
        sub_id, user_id, coupon_id = value.split(":")
        return cls(int(sub_id), int(user_id), int(coupon_id))

    @classmethod
    def try_parse(cls, value: str) -> ReminderMember | None:
        try:
            return cls.parse(value)
        except ValueError:
            return None

    @staticmethod
    def sub_id_of(value: str) -> int:
        return int(value.partition(":")[0])

    @staticmethod
    def coupon_id_text(value: str) -> str:
        """The coupon id's digits (the hot path groups by them before converting)."""
        return value.rpartition(":")[2]


def member(sub_id: int, user_id: int, coupon_id: int) -> str:
    """The member string; bulk indexing builds it for every row, so no tuple on the way."""
    return f"{sub_id}:{user_id}:{coupon_id}"
