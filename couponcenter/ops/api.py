"""``/api/ops/``: the console's data and actions for automation.

Staff holding the model permissions of what each endpoint reads or writes, as the admin asks
for the same data: dead letters (``reminders.DeadLetter``), expiry tasks and the live settings
rows (``ReminderSettings``, ``ExpirySettings``).

Reads go through the apps' selectors (``reminders.selectors``, ``expiry.selectors``), writes
through their services, exactly as the admin pages do: one view per operation, nested input and
output serializers.
"""

from __future__ import annotations

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import transaction
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import PermissionDenied
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from couponcenter.core.api.errors import error_responses
from couponcenter.core.api.fields import IsoDurationModelSerializer
from couponcenter.core.api.permissions import staff_permissions
from couponcenter.core.time import utc_text
from couponcenter.ops import overview
from expiry import selectors as expiry_selectors
from expiry import services as expiry_services
from expiry.models import ExpirySettings
from reminders import services
from reminders.models import ReminderSettings
from reminders.selectors import dead_letters, queues, reminder_settings_get
from reminders.services import dead_letters as dead_letter_services

DEAD_LIST_MAX = 1000
VIEW_DEAD_LETTERS = "reminders.view_deadletter"
CONFIG_VIEW = ("reminders.view_remindersettings", "expiry.view_expirysettings")
# What changing each section of the live configuration needs.
CONFIG_CHANGE = {
    "reminder": "reminders.change_remindersettings",
    "expiry": "expiry.change_expirysettings",
}


def _topic_field(**kwargs) -> serializers.CharField:
    return serializers.CharField(max_length=100, **kwargs)


class _SlotCheck:
    """``topic`` must be known and ``slot`` exist in it (under any layout still served)."""

    def validate(self, attrs: dict) -> dict:
        known = queues.topic_slot_counts()
        topic, slot = attrs.get("topic"), attrs.get("slot")
        if topic is None:
            return attrs
        if topic not in known:
            raise serializers.ValidationError({"topic": [f"Unknown topic; known: {sorted(known)}"]})
        if slot is not None and slot >= known[topic]:
            raise serializers.ValidationError({"slot": ["No such slot in this topic."]})
        return attrs


class WorkerSerializer(serializers.Serializer):
    worker_id = serializers.CharField()
    host = serializers.CharField()
    pid = serializers.IntegerField()
    version = serializers.CharField()
    config_version = serializers.IntegerField()
    current = serializers.BooleanField(help_text="Runs the current ReminderSettings version.")
    live = serializers.BooleanField()
    heartbeat_age_s = serializers.FloatField()
    owned = serializers.DictField(child=serializers.ListField(child=serializers.IntegerField()))


class BacklogApi(APIView):
    # The engine's queues (shown in the admin as dead letters) and the expiry tasks.
    permission_classes = [staff_permissions(GET=(VIEW_DEAD_LETTERS, "expiry.view_expirytask"))]

    class FilterSerializer(_SlotCheck, serializers.Serializer):
        class Meta:
            ref_name = "BacklogFilter"

        topic = _topic_field(required=False, help_text="Only this topic (unknown: 400).")

    class SlotSerializer(serializers.Serializer):
        slot = serializers.IntegerField()
        store = serializers.IntegerField()
        due = serializers.IntegerField()
        oldest_overdue_ms = serializers.IntegerField()
        prepare = serializers.IntegerField()
        dead = serializers.IntegerField()

    class TopicSerializer(serializers.Serializer):
        topic = serializers.CharField()
        store = serializers.IntegerField()
        due = serializers.IntegerField()
        oldest_overdue_ms = serializers.IntegerField()
        prepare = serializers.IntegerField()
        dead = serializers.IntegerField()
        slots = serializers.ListField(child=serializers.DictField())

    class OutputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "BacklogOutput"

        now_ms = serializers.IntegerField()
        totals = serializers.DictField(child=serializers.IntegerField())
        topics = serializers.ListField(child=serializers.DictField())
        lateness_p99_ms = serializers.IntegerField(
            allow_null=True,
            help_text="Interpolated inside its histogram bucket; past the last bucket's edge "
            "(600000) it is that edge plus one: later than 10 minutes, by an unknown amount.",
        )
        warnings = serializers.ListField(child=serializers.CharField())
        workers = WorkerSerializer(many=True)
        expiry = serializers.DictField()

    @extend_schema(
        operation_id="ops_backlog",
        summary="Backlog per topic and slot, lateness, workers and the expiry sweeper",
        parameters=[FilterSerializer],
        responses={200: OutputSerializer, **error_responses(400, 403)},
    )
    def get(self, request: Request) -> Response:
        f = self.FilterSerializer(data=request.query_params)
        f.is_valid(raise_exception=True)
        topic = f.validated_data.get("topic")
        live = reminder_settings_get(max_age_s=0)
        data = queues.backlog(topic=topic)
        p99 = queues.recent_p99_ms(queues.throughput(minutes=queues.RECENT_MINUTES))
        expiry = expiry_selectors.expiry_stats()
        body = {
            **queues.backlog_as_dict(data),
            "lateness_p99_ms": p99,
            "warnings": overview.warnings(data=data, p99_ms=p99, live=live),
            "workers": WorkerSerializer(queues.workers(live=live), many=True).data,
            "expiry": {
                **expiry,
                "oldest_due_at": utc_text(expiry["oldest_due_at"])
                if expiry["oldest_due_at"]
                else None,
            },
        }
        return Response(body)


class DeadLetterSerializer(serializers.Serializer):
    topic = serializers.CharField()
    slot = serializers.IntegerField()
    job_id = serializers.CharField()
    business_key = serializers.CharField(
        help_text="A timeout job's type:id, a reminder's coupon and user; empty if the row is gone."
    )
    user_id = serializers.IntegerField(allow_null=True)
    attempts = serializers.IntegerField()
    last_error = serializers.CharField()
    died_at = serializers.DateTimeField()


class DeadLetterListApi(APIView):
    permission_classes = [staff_permissions(GET=(VIEW_DEAD_LETTERS,))]

    class FilterSerializer(_SlotCheck, serializers.Serializer):
        class Meta:
            ref_name = "DeadLetterListFilter"

        topic = _topic_field(required=False)
        slot = serializers.IntegerField(required=False, min_value=0)
        q = serializers.CharField(required=False, default="", max_length=100)
        limit = serializers.IntegerField(
            required=False, default=100, min_value=1, max_value=DEAD_LIST_MAX
        )

        def validate(self, attrs: dict) -> dict:
            if attrs.get("slot") is not None and not attrs.get("topic"):
                raise serializers.ValidationError({"slot": ["Give a topic with the slot."]})
            return super().validate(attrs)

    class OutputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "DeadLetterListOutput"

        total = serializers.IntegerField()
        has_more = serializers.BooleanField()
        results = DeadLetterSerializer(many=True)

    @extend_schema(
        operation_id="ops_dead_letters",
        summary="Dead letters, most recent first",
        parameters=[FilterSerializer],
        responses={200: OutputSerializer, **error_responses(400, 403)},
    )
    def get(self, request: Request) -> Response:
        f = self.FilterSerializer(data=request.query_params)
        f.is_valid(raise_exception=True)
        page = dead_letters.dead_letter_list(
            topic=f.validated_data.get("topic"),
            slot=f.validated_data.get("slot"),
            search=f.validated_data["q"],
            limit=f.validated_data["limit"],
        )
        out = {"total": page.total, "has_more": page.has_more, "results": page.letters}
        return Response(self.OutputSerializer(out).data)


class DeadLetterRequeueApi(APIView):
    permission_classes = [staff_permissions(POST=("reminders.change_deadletter",))]

    class InputSerializer(_SlotCheck, serializers.Serializer):
        class Meta:
            ref_name = "DeadLetterRequeueInput"

        topic = _topic_field()
        slot = serializers.IntegerField(required=False, min_value=0)
        job_ids = serializers.ListField(
            child=serializers.CharField(max_length=200),
            required=False,
            max_length=dead_letter_services.REQUEUE_CAP,
        )
        all = serializers.BooleanField(required=False, default=False)
        limit = serializers.IntegerField(
            required=False,
            default=dead_letter_services.REQUEUE_CAP,
            min_value=1,
            max_value=dead_letter_services.REQUEUE_CAP,
        )

        def validate(self, attrs: dict) -> dict:
            attrs = super().validate(attrs)
            if attrs["all"] == bool(attrs.get("job_ids")):
                raise serializers.ValidationError("Give either job_ids (with slot) or all: true.")
            if attrs.get("job_ids") and attrs.get("slot") is None:
                raise serializers.ValidationError({"slot": ["Required with job_ids."]})
            return attrs

    class OutputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "DeadLetterRequeueOutput"

        requested = serializers.IntegerField()
        requeued = serializers.IntegerField()
        rows_fixed = serializers.IntegerField()
        skipped = serializers.ListField(child=serializers.CharField())

    @extend_schema(
        operation_id="ops_dead_letters_requeue",
        summary="Requeue dead letters (by id, or all of a topic or slot, capped)",
        request=InputSerializer,
        responses={200: OutputSerializer, **error_responses(400, 403)},
    )
    def post(self, request: Request) -> Response:
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        if v["all"]:
            result = dead_letter_services.dead_letters_requeue_matching(
                topic=v["topic"], slot=v.get("slot"), limit=v["limit"]
            )
        else:
            result = dead_letter_services.dead_letters_requeue(
                topic=v["topic"], slot=v["slot"], job_ids=v["job_ids"]
            )
        return Response(self.OutputSerializer(result).data)


class ReminderSettingsSerializer(IsoDurationModelSerializer):
    class Meta:
        model = ReminderSettings
        exclude = ["id"]
        read_only_fields = ["version", "updated_at"]


class ExpirySettingsSerializer(IsoDurationModelSerializer):
    class Meta:
        model = ExpirySettings
        fields = ["batch_size", "interval", "retention", "user_coupon_retention", "updated_at"]
        read_only_fields = ["updated_at"]


class ConfigErrorSerializer(serializers.Serializer):
    errors = serializers.DictField(
        child=serializers.JSONField(),
        help_text="Per section (`reminder`, `expiry`), the messages per setting; an unknown "
        "section or a body that is not an object has a list of messages instead.",
    )


CONFIG_BAD_REQUEST = OpenApiResponse(
    ConfigErrorSerializer, description="Bad input: messages per section and setting."
)


class ConfigApi(APIView):
    # A PATCH also needs the change permission of each section it sends (``patch``).
    permission_classes = [staff_permissions(GET=CONFIG_VIEW, PATCH=CONFIG_VIEW)]

    class OutputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "ConfigOutput"

        reminder = ReminderSettingsSerializer()
        expiry = ExpirySettingsSerializer()
        workers = WorkerSerializer(many=True)

    class InputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "ConfigInput"

        reminder = serializers.DictField(required=False)
        expiry = serializers.DictField(required=False)

    def _body(self) -> dict:
        live = reminder_settings_get(max_age_s=0)
        data = {
            "reminder": live,
            "expiry": expiry_services.expiry_settings_get(max_age_s=0),
            "workers": [w for w in queues.workers(live=live) if w.live],
        }
        return self.OutputSerializer(data).data

    @extend_schema(
        operation_id="ops_config",
        summary="Live configuration, and which running workers picked up its version",
        responses={200: OutputSerializer, **error_responses(403)},
    )
    def get(self, request: Request) -> Response:
        return Response(self._body())

    @extend_schema(
        operation_id="ops_config_update",
        summary="Change the live configuration (validated as in the admin; bumps the version)",
        request=InputSerializer,
        responses={200: OutputSerializer, 400: CONFIG_BAD_REQUEST, **error_responses(403)},
    )
    def patch(self, request: Request) -> Response:
        if not isinstance(request.data, dict):
            raise serializers.ValidationError({"non_field_errors": ["Send a JSON object."]})
        user = request.user
        sent = [perm for name, perm in CONFIG_CHANGE.items() if name in request.data]
        # A body naming no section changes nothing, yet only someone who may change one sends it.
        if not (user.has_perms(sent) if sent else any(map(user.has_perm, CONFIG_CHANGE.values()))):
            raise PermissionDenied(
                "Changing a section needs its permission: "
                + ", ".join(f"{name}: {perm}" for name, perm in CONFIG_CHANGE.items())
            )
        errors: dict = {
            name: ["Unknown section; known: reminder, expiry."]
            for name in request.data
            if name not in {"reminder", "expiry"}
        }
        body = self.InputSerializer(data=request.data)
        if not body.is_valid():
            errors.update(body.errors)
        data = body.validated_data if not errors else {}
        sections = {
            "reminder": (reminder_settings_get(max_age_s=0), ReminderSettingsSerializer),
            "expiry": (expiry_services.expiry_settings_get(max_age_s=0), ExpirySettingsSerializer),
        }
        changed = {}
        for name, (live, serializer_class) in sections.items():
            # The stored row (not the cached live one, which stays as it is until the save; a row
            # invalid in the database is fixed here by sending its bad fields too).
            row = type(live).objects.get(pk=live.pk)
            fields = data.get(name) or {}
            serializer = serializer_class(row, data=fields, partial=True)
            unknown = {k: ["Unknown setting."] for k in fields if k not in serializer.fields}
            if unknown or not serializer.is_valid():
                errors[name] = {**unknown, **(serializer.errors if not unknown else {})}
                continue
            for field, value in serializer.validated_data.items():
                setattr(row, field, value)
            try:
                row.full_clean()  # the model's bounds and rules, as the admin applies them
            except DjangoValidationError as exc:
                errors[name] = exc.message_dict
                continue
            if serializer.validated_data:
                changed[name] = row
        if errors:
            raise serializers.ValidationError(errors)
        with transaction.atomic():
            if "reminder" in changed:
                services.reminder_settings_save(instance=changed["reminder"])
            if "expiry" in changed:
                expiry_services.expiry_settings_save(instance=changed["expiry"])
        return Response(self._body())
