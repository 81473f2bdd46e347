"""The timeout jobs API's serializers: a job as it comes in (one, in bulk, a filter, a key, a new
time, a reason to end it) and as it goes out. Their class names are the OpenAPI schema's
component names. A bulk create skips DRF's machinery on its way in (``valid_jobs``) and out
(``bulk_output``) with the same rules and the same shape."""

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import serializers
from rest_framework.fields import SkipField, empty

from couponcenter.core.api.fields import AwareDateTimeField
from couponcenter.core.time import utc_text
from reminders import attributes
from reminders.models import TimeoutJob
from reminders.recurrence import rules
from reminders.selectors.timeout_topics import timeout_topics_for
from reminders.services.timeouts_bulk import BULK_MAX, BulkJob

STATUS_NAMES = {choice.label.lower(): choice.value for choice in TimeoutJob.Status}
NAME_OF_STATUS = {value: name for name, value in STATUS_NAMES.items()}


class _StatusName(serializers.ChoiceField):
    """The status as the same lower-case name the list's ``status`` filter takes (an enum in the
    schema); ``status_code`` keeps the number."""

    def to_representation(self, value: int) -> str:
        return NAME_OF_STATUS[value]


class TimeoutJobOutputSerializer(serializers.ModelSerializer):
    status = _StatusName(choices=sorted(STATUS_NAMES), read_only=True)
    status_code = serializers.IntegerField(source="status", read_only=True)

    class Meta:
        model = TimeoutJob
        fields = [
            "job_id",
            "topic",
            "biz_type",
            "biz_id",
            "status",
            "status_code",
            "action_time",
            "attribute",
            "recurrence",
            "series_start",
            "attempts",
            "last_error",
            "gmt_create",
            "gmt_modified",
        ]


class _AttributeField(serializers.JSONField):
    """The job's attribute, checked by ``attributes.check`` before anything walks it
    recursively (DRF's own field first encodes the value to prove it is JSON, which a parsed
    body always is)."""

    def to_internal_value(self, data):
        try:
            attributes.check(data)
        except ValueError as exc:
            raise serializers.ValidationError(str(exc)) from None
        return data


class TimeoutJobInputSerializer(serializers.Serializer):
    topic = serializers.CharField(max_length=64)
    biz_type = serializers.CharField(max_length=64)
    biz_id = serializers.CharField(max_length=128)
    # Read as UTC, whatever zone a request runs in: a job keeps the instant only, and a fixed
    # zone spares a bulk the lookup of the request's zone per job, and the rest of the request
    # (the insert, the index, the answer) the conversions out of a ``ZoneInfo``.
    action_time = AwareDateTimeField(default_timezone=UTC)
    attribute = _AttributeField(
        required=False,
        default=dict,
        help_text="A JSON object, given back when the job fires: nested at most "
        f"{settings.TIMEOUT_ATTRIBUTE_MAX_DEPTH} levels deep, at most "
        f"{settings.TIMEOUT_ATTRIBUTE_MAX_BYTES} bytes of JSON.",
    )
    recurrence = serializers.CharField(
        max_length=rules.MAX_CHARS,
        required=False,
        default="",
        allow_blank=True,
        help_text="Repeat: an RRULE (`FREQ=DAILY;BYHOUR=9;COUNT=30`) or a cron expression "
        "(`*/5 * * * *`, UTC). The series starts at `action_time`; each next occurrence is "
        "created when one has fired.",
    )

    def validate_topic(self, value: str) -> str:
        return _usable_topic(self.context, value)

    def validate_recurrence(self, value: str) -> str:
        if value:
            try:
                rules.check(value)
            except ValueError as exc:
                raise serializers.ValidationError(f"Invalid: {exc}.") from None
        return value


class TimeoutJobFilterSerializer(serializers.Serializer):
    topic = serializers.CharField(max_length=64, required=False)
    status = serializers.ChoiceField(choices=sorted(STATUS_NAMES), required=False)
    biz_type = serializers.CharField(max_length=64, required=False)
    action_time_after = AwareDateTimeField(required=False, help_text="Inclusive.")
    action_time_before = AwareDateTimeField(required=False, help_text="Exclusive.")

    def validate_topic(self, value: str) -> str:
        return _usable_topic(self.context, value)

    def validate_status(self, value: str) -> int:
        return STATUS_NAMES[value]


def _usable_topic(context: dict, value: str) -> str:
    """A topic the caller may use (``context["request"]``): staff all, others the ones they own
    (``topic_usable_by``). Any other is unknown to them. Looked up once a request (kept in the
    context): a bulk names a topic per job."""
    usable = context.get("usable_topics")
    if usable is None:
        usable = context["usable_topics"] = timeout_topics_for(context["request"].user)
    if value not in usable:
        raise serializers.ValidationError(f"Unknown topic; known: {sorted(usable)}")
    return value


class TimeoutJobBulkInputSerializer(serializers.Serializer):
    jobs = TimeoutJobInputSerializer(many=True, allow_empty=False, max_length=BULK_MAX)


class TimeoutJobBulkResultSerializer(serializers.Serializer):
    job_id = serializers.IntegerField()
    topic = serializers.CharField()
    biz_type = serializers.CharField()
    biz_id = serializers.CharField()
    action_time = serializers.DateTimeField()
    created = serializers.BooleanField(help_text="False: a job was pending for this key already.")


class TimeoutJobBulkOutputSerializer(serializers.Serializer):
    created = serializers.IntegerField()
    existing = serializers.IntegerField()
    jobs = TimeoutJobBulkResultSerializer(many=True)


def valid_jobs(data, context: dict) -> list[dict] | None:
    """The bulk body's jobs, each run through the input serializer's own fields, its
    ``validate_<field>`` methods and ``validate``: its rules, and no others. DRF's machinery
    around them, per job (errors gathered field by field, defaults looked up), costs more than
    the insert, so they are run here directly; and a value a bulk repeats (its topic, type, time
    or rule, thousands of times) is checked once. None at the first value a field refuses, or
    when the body is not a list of objects: the serializers then answer it, with their
    messages."""
    jobs = data.get("jobs") if isinstance(data, dict) else None
    if type(jobs) is not list or not 1 <= len(jobs) <= BULK_MAX:
        return None
    serializer = TimeoutJobInputSerializer(context=context)
    checks: list[tuple[str, serializers.Field, Callable | None, dict[Any, Any]]] = [
        (name, field, getattr(serializer, f"validate_{name}", None), {})
        for name, field in serializer.fields.items()
    ]
    out = []
    try:
        for job in jobs:
            if type(job) is not dict:
                return None
            valid = {}
            for name, field, validate, seen in checks:
                value = job.get(name, empty)  # the field's get_value, for a JSON object
                # A text (or an absent value) gives the same result every time; a given dict or
                # list is checked anew. No two jobs share a dict: a default one is copied.
                known = type(value) is str or value is empty
                result = seen.get(value, empty) if known else empty
                if result is empty:
                    result = field.run_validation(value)
                    if validate is not None:
                        result = validate(result)
                    if known:
                        seen[value] = result
                elif type(result) is dict:
                    result = dict(result)
                valid[name] = result
            out.append(serializer.validate(valid))
    except (serializers.ValidationError, DjangoValidationError, SkipField):
        return None
    return out


def bulk_output(results: list[tuple[BulkJob | TimeoutJob, bool]]) -> dict:
    """A bulk create's answer in ``TimeoutJobBulkOutputSerializer``'s shape, written directly
    (running the serializer over 10,000 jobs would cost more than creating them), each time
    spelled once: a bulk's jobs share few times."""
    created = sum(1 for _, made in results if made)
    texts: dict[datetime, str] = {}
    jobs = []
    for job, made in results:
        at = texts.get(job.action_time)
        if at is None:
            at = texts[job.action_time] = utc_text(job.action_time)
        jobs.append(
            {
                "job_id": job.job_id,
                "topic": job.topic,
                "biz_type": job.biz_type,
                "biz_id": job.biz_id,
                "action_time": at,
                "created": made,
            }
        )
    return {"created": created, "existing": len(results) - created, "jobs": jobs}


class TimeoutJobKeySerializer(serializers.Serializer):
    topic = serializers.CharField(max_length=64)
    biz_type = serializers.CharField(max_length=64)
    biz_id = serializers.CharField(max_length=128)

    def validate_topic(self, value: str) -> str:
        return _usable_topic(self.context, value)


class TimeoutJobRescheduleSerializer(serializers.Serializer):
    action_time = AwareDateTimeField()


class TimeoutJobEndSerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=400, help_text="Why: kept in the job's history.")
