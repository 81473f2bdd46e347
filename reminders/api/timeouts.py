"""Generic timeout jobs: create, read, cancel."""

import json

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.permissions import BasePermission
from rest_framework.response import Response
from rest_framework.views import APIView

from couponcenter.core.api.errors import conflict_serializer, error_responses
from couponcenter.core.api.fields import AwareDateTimeField
from reminders import services
from reminders.models import TimeoutJob

ATTRIBUTE_MAX_CHARS = 16_000


class CanManageTimeouts(BasePermission):
    message = "Timeout jobs need staff or the manage_timeouts permission."

    def has_permission(self, request, view) -> bool:
        user = request.user
        return bool(
            user
            and user.is_authenticated
            and (user.is_staff or user.has_perm("reminders.manage_timeouts"))
        )


class TimeoutJobOutputSerializer(serializers.ModelSerializer):
    status = serializers.CharField(source="get_status_display")
    status_code = serializers.IntegerField(source="status")

    class Meta:
        model = TimeoutJob
        fields = [
            "job_id", "topic", "biz_type", "biz_id", "status", "status_code", "action_time",
            "attribute", "attempts", "last_error", "gmt_create", "gmt_modified",
        ]  # fmt: skip


class TimeoutJobInputSerializer(serializers.Serializer):
    topic = serializers.CharField(max_length=64)
    biz_type = serializers.CharField(max_length=64)
    biz_id = serializers.CharField(max_length=128)
    action_time = AwareDateTimeField()
    attribute = serializers.JSONField(required=False, default=dict)

    def validate_attribute(self, value):
        if not isinstance(value, dict):
            raise serializers.ValidationError("Must be a JSON object.")
        if len(json.dumps(value)) > ATTRIBUTE_MAX_CHARS:
            raise serializers.ValidationError("Too large (16 kB of JSON at most).")
        if _has_nul(value):  # PostgreSQL's jsonb cannot store U+0000
            raise serializers.ValidationError("Must not contain NUL (U+0000) characters.")
        return value


def _has_nul(value) -> bool:
    """Iterative, so a deeply nested object cannot exhaust the stack."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str) and "\x00" in item:
            return True
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


class TimeoutJobCreateApi(APIView):
    permission_classes = [CanManageTimeouts]

    @extend_schema(
        request=TimeoutJobInputSerializer,
        responses={
            201: TimeoutJobOutputSerializer,
            409: conflict_serializer("TimeoutJobConflict", ["duplicate"]),
            **error_responses(400, 403),
        },
    )
    def post(self, request):
        data = TimeoutJobInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        job = services.timeout_job_create(**data.validated_data)
        return Response(TimeoutJobOutputSerializer(job).data, status=status.HTTP_201_CREATED)


class TimeoutJobDetailApi(APIView):
    permission_classes = [CanManageTimeouts]

    @extend_schema(responses={200: TimeoutJobOutputSerializer, **error_responses(403, 404)})
    def get(self, request, job_id: int):
        job = get_object_or_404(TimeoutJob, pk=job_id)
        return Response(TimeoutJobOutputSerializer(job).data)

    @extend_schema(
        request=None,
        responses={
            200: TimeoutJobOutputSerializer,
            409: conflict_serializer("TimeoutJobCancelConflict", ["not_pending"]),
            **error_responses(403, 404),
        },
    )
    def delete(self, request, job_id: int):
        job = get_object_or_404(TimeoutJob, pk=job_id)
        job = services.timeout_job_cancel(job=job)
        return Response(TimeoutJobOutputSerializer(job).data)
