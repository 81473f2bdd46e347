"""``/api/timeout-topics/``: generic timeout topics kept as data, for staff holding the
``TimeoutTopic`` model permission of the operation (view, add, change, delete), as in the admin.
Workers pick a change up while they run; topics from ``settings.TIMEOUT_TOPICS`` are listed,
read-only."""

from __future__ import annotations

from dataclasses import fields

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError as DjangoValidationError
from drf_spectacular.utils import OpenApiExample, OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound
from rest_framework.response import Response
from rest_framework.views import APIView

from couponcenter.core.api.errors import conflict_serializer, error_responses
from couponcenter.core.api.permissions import staff_permissions
from reminders import services
from reminders.models import TimeoutTopic
from reminders.selectors.timeout_topics import timeout_topic_specs
from reminders.timeout_topic_rules import TIMEOUT_TOPIC_KNOBS, TimeoutTopicSpec

VIEW = "reminders.view_timeouttopic"
IN_USE = conflict_serializer("TimeoutTopicInUse", ["topic_in_use"])


def _knob_fields(**options) -> dict[str, serializers.Field]:
    """A field per knob, with its help text; its range is the model's to check (one set of
    rules: the admin and this API refuse the same values)."""
    return {
        knob.name: serializers.IntegerField(help_text=knob.help, **options)
        for knob in TIMEOUT_TOPIC_KNOBS
    }


class TopicOutputSerializer(serializers.Serializer):
    name = serializers.CharField()
    type = serializers.CharField()
    target = serializers.CharField()
    secret_set = serializers.BooleanField(help_text="The secret itself is never shown.")
    previous_secret_until = serializers.DateTimeField(
        allow_null=True,
        help_text="Until then the secret replaced last signs every call as well (a second "
        "v1 signature in webhook-signature), so receivers move to the new one without a refusal.",
    )
    legacy_signature = serializers.BooleanField(
        help_text="Also sent: X-Coupon-Center-Signature and X-Coupon-Center-Timestamp."
    )
    allow_http = serializers.BooleanField()
    fair_key = serializers.CharField()
    paused = serializers.BooleanField()
    owner_user = serializers.IntegerField(source="owner_user_id", allow_null=True)
    owner_group = serializers.IntegerField(source="owner_group_id", allow_null=True)
    read_only = serializers.BooleanField(help_text="Defined in settings.TIMEOUT_TOPICS.")

    def get_fields(self) -> dict[str, serializers.Field]:
        return {**super().get_fields(), **_knob_fields()}


def _out(spec: TimeoutTopicSpec) -> dict:
    data = {f.name: getattr(spec, f.name) for f in fields(spec)}
    data.update(target=spec.target, secret_set=bool(spec.secret))
    return TopicOutputSerializer(data).data


class TopicInputSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=64)
    type = serializers.ChoiceField(choices=TimeoutTopic.Type.values)
    target = serializers.CharField(max_length=500, required=False, allow_blank=True)
    secret = serializers.CharField(
        max_length=256,
        required=False,
        write_only=True,
        help_text="whsec_<base64> (a key of 24 bytes or more), or text of 32 bytes or more used as "
        "the key itself. A new secret on a change: the old one signs as well for the overlap.",
    )
    legacy_signature = serializers.BooleanField(required=False)
    allow_http = serializers.BooleanField(required=False)
    fair_key = serializers.CharField(max_length=70, required=False, allow_blank=True)
    paused = serializers.BooleanField(required=False)
    owner_user = serializers.PrimaryKeyRelatedField(
        queryset=get_user_model().objects.all(), required=False, allow_null=True
    )
    owner_group = serializers.PrimaryKeyRelatedField(
        queryset=Group.objects.all(), required=False, allow_null=True
    )

    def get_fields(self) -> dict[str, serializers.Field]:
        return {**super().get_fields(), **_knob_fields(required=False)}


def _save(topic: TimeoutTopic, changes: dict) -> TimeoutTopic:
    try:
        return services.timeout_topic_save(topic=topic, **changes)
    except DjangoValidationError as exc:
        raise serializers.ValidationError(exc.message_dict) from None


EXAMPLE = OpenApiExample(
    "Close unpaid orders",
    value={
        "name": "order.close",
        "type": "http",
        "target": "https://orders.example.com/timeouts",
        "secret": "whsec_<base64 of 32 random bytes>",
        "concurrency": 16,
        "timeout_ms": 2000,
        "rate_limit_per_s": 500,
        "fair_key": "attribute.tenant",
    },
    request_only=True,
)


class TopicListApi(APIView):
    permission_classes = [staff_permissions(GET=(VIEW,), POST=("reminders.add_timeouttopic",))]

    @extend_schema(responses={200: TopicOutputSerializer(many=True), **error_responses(403)})
    def get(self, request):
        return Response([_out(spec) for spec in timeout_topic_specs().values()])

    @extend_schema(
        request=TopicInputSerializer,
        examples=[EXAMPLE],
        responses={201: TopicOutputSerializer, **error_responses(400, 403)},
    )
    def post(self, request):
        data = TopicInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        topic = _save(TimeoutTopic(), data.validated_data)
        return Response(_out(_spec(topic.name)), status=status.HTTP_201_CREATED)


def _spec(name: str) -> TimeoutTopicSpec:
    spec = timeout_topic_specs().get(name)
    if spec is None:
        raise NotFound("No such topic.")
    return spec


def _row(name: str) -> TimeoutTopic:
    row = TimeoutTopic.objects.filter(name=name).first()
    if row is None:
        if name in timeout_topic_specs():
            raise serializers.ValidationError(
                {"name": ["Defined in settings.TIMEOUT_TOPICS: read-only."]}
            )
        raise NotFound("No such topic.")
    return row


class TopicDetailApi(APIView):
    permission_classes = [
        staff_permissions(
            GET=(VIEW,),
            PATCH=("reminders.change_timeouttopic",),
            DELETE=("reminders.delete_timeouttopic",),
        )
    ]

    @extend_schema(responses={200: TopicOutputSerializer, **error_responses(403, 404)})
    def get(self, request, name: str):
        return Response(_out(_spec(name)))

    @extend_schema(
        request=TopicInputSerializer(partial=True),
        examples=[
            OpenApiExample("Pause it", value={"paused": True}, request_only=True),
        ],
        responses={200: TopicOutputSerializer, **error_responses(400, 403, 404)},
    )
    def patch(self, request, name: str):
        row = _row(name)
        data = TopicInputSerializer(data=request.data, partial=True)
        data.is_valid(raise_exception=True)
        _save(row, data.validated_data)
        return Response(_out(_spec(name)))

    @extend_schema(
        request=None,
        responses={
            204: OpenApiResponse(description="Deleted."),
            409: IN_USE,
            **error_responses(400, 403, 404),
        },
    )
    def delete(self, request, name: str):
        services.timeout_topic_delete(topic=_row(name))
        return Response(status=status.HTTP_204_NO_CONTENT)
