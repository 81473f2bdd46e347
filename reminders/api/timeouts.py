"""Generic timeout jobs: create (one, idempotent, or in bulk), list, and read, cancel or move one
by its ``job_id`` or by its business key (topic, biz_type, biz_id)."""

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound
from rest_framework.permissions import BasePermission
from rest_framework.response import Response
from rest_framework.views import APIView

from couponcenter.core.api.errors import (
    OVER_QUOTA,
    conflict_serializer,
    error_responses,
    flat_errors,
)
from couponcenter.core.api.pagination import NewestFirstCursor
from couponcenter.core.api.permissions import staff_permissions
from reminders import selectors, services
from reminders.api.timeout_serializers import (
    TimeoutJobBulkInputSerializer,
    TimeoutJobBulkOutputSerializer,
    TimeoutJobEndSerializer,
    TimeoutJobFilterSerializer,
    TimeoutJobInputSerializer,
    TimeoutJobKeySerializer,
    TimeoutJobOutputSerializer,
    TimeoutJobRescheduleSerializer,
    bulk_output,
    valid_jobs,
)
from reminders.models import TimeoutJob
from reminders.selectors.timeout_topics import (
    timeout_topic_spec,
    timeout_topics_for,
    topic_usable_by,
)

# One component per set of 409 codes, shared by every operation that answers it.
DUPLICATE = conflict_serializer("TimeoutJobConflict", ["duplicate"])
NOT_PENDING = conflict_serializer("TimeoutJobCancelConflict", ["not_pending"])


class CanManageTimeouts(BasePermission):
    message = "Timeout jobs need the manage_timeouts permission."

    def has_permission(self, request, view) -> bool:
        user = request.user
        return bool(user and user.is_authenticated and user.has_perm("reminders.manage_timeouts"))


def _owner_id(request) -> int | None:
    """The account a create is for (its fair key, its quotas): the caller, unless staff."""
    return None if request.user.is_staff else request.user.pk


def _job_visible(request, job: TimeoutJob) -> TimeoutJob:
    spec = timeout_topic_spec(job.topic)
    if not request.user.is_staff and (spec is None or not topic_usable_by(spec, request.user)):
        raise NotFound("No such job.")
    return job


CREATE_EXAMPLE = OpenApiExample(
    "Close order 123 if unpaid in 30 minutes",
    value={
        "topic": "order.close",
        "biz_type": "order",
        "biz_id": "123",
        "action_time": "2026-11-23T12:30:00Z",
        "attribute": {"tenant": "acme"},
    },
    request_only=True,
)
RECURRING_EXAMPLE = OpenApiExample(
    "Remind store 42 to reconcile every morning for 30 days",
    value={
        "topic": "store.reconcile",
        "biz_type": "store",
        "biz_id": "42",
        "action_time": "2026-11-24T09:00:00Z",
        "recurrence": "FREQ=DAILY;COUNT=30",
    },
    request_only=True,
)
KEY_PARAMETERS = [
    OpenApiParameter("topic", str, required=True, description="The job's topic."),
    OpenApiParameter("biz_type", str, required=True, description="e.g. `order`."),
    OpenApiParameter("biz_id", str, required=True, description="e.g. `123`."),
]


class TimeoutJobListCreateApi(APIView):
    """``POST``: create a job, idempotently: while a job is pending for the same (topic, biz_type,
    biz_id), the same request answers 200 with that job, unchanged. ``GET``: jobs, newest first,
    filtered, behind a cursor."""

    permission_classes = [CanManageTimeouts]
    pagination_class = NewestFirstCursor

    @extend_schema(
        request=TimeoutJobInputSerializer,
        examples=[CREATE_EXAMPLE, RECURRING_EXAMPLE],
        responses={
            201: OpenApiResponse(TimeoutJobOutputSerializer, description="Created."),
            200: OpenApiResponse(
                TimeoutJobOutputSerializer,
                description="A job was pending for this business key already: that job.",
            ),
            409: DUPLICATE,
            429: OVER_QUOTA,
            **error_responses(400, 403),
        },
    )
    def post(self, request):
        data = TimeoutJobInputSerializer(data=request.data, context={"request": request})
        data.is_valid(raise_exception=True)
        job, created = services.timeout_job_ensure(
            **data.validated_data, owner_id=_owner_id(request)
        )
        return Response(
            TimeoutJobOutputSerializer(job).data,
            status=status.HTTP_201_CREATED if created else status.HTTP_200_OK,
        )

    @extend_schema(
        parameters=[TimeoutJobFilterSerializer],
        responses={200: TimeoutJobOutputSerializer(many=True), **error_responses(400, 403)},
    )
    def get(self, request):
        filters = TimeoutJobFilterSerializer(
            data=request.query_params, context={"request": request}
        )
        filters.is_valid(raise_exception=True)
        jobs = selectors.timeout_job_list(**filters.validated_data)
        if not request.user.is_staff:  # only the topics this caller may use
            jobs = jobs.filter(topic__in=list(timeout_topics_for(request.user)))
        paginator = self.pagination_class()
        page = paginator.paginate_queryset(jobs, request, view=self)
        return paginator.get_paginated_response(TimeoutJobOutputSerializer(page, many=True).data)


class TimeoutJobBulkApi(APIView):
    """Create up to 10,000 jobs in one transaction, indexed in Redis once it commits: all or
    nothing. Each job is idempotent as the single create: a key with a pending job gives that
    job (``created: false``). The same key twice in one request is a 400."""

    permission_classes = [CanManageTimeouts]

    @extend_schema(
        request=TimeoutJobBulkInputSerializer,
        examples=[
            OpenApiExample(
                "Two order timeouts",
                value={
                    "jobs": [
                        {
                            "topic": "order.close",
                            "biz_type": "order",
                            "biz_id": "123",
                            "action_time": "2026-11-23T12:30:00Z",
                        },
                        {
                            "topic": "order.close",
                            "biz_type": "order",
                            "biz_id": "124",
                            "action_time": "2026-11-23T12:31:00Z",
                        },
                    ]
                },
                request_only=True,
            )
        ],
        responses={
            201: OpenApiResponse(TimeoutJobBulkOutputSerializer, description="Some created."),
            200: OpenApiResponse(
                TimeoutJobBulkOutputSerializer, description="Every key had a pending job already."
            ),
            409: DUPLICATE,
            429: OVER_QUOTA,
            **error_responses(400, 403),
        },
    )
    def post(self, request):
        jobs = valid_jobs(request.data, {"request": request})
        if jobs is None:  # something to say about it: the serializers name each problem
            data = TimeoutJobBulkInputSerializer(data=request.data, context={"request": request})
            if not data.is_valid():  # a bad job is named by its place: "jobs.3.action_time"
                raise serializers.ValidationError(flat_errors(data.errors))
            jobs = data.validated_data["jobs"]
        results = services.timeout_jobs_bulk_create(jobs, owner_id=_owner_id(request))
        body = bulk_output(results)
        code = status.HTTP_201_CREATED if body["created"] else status.HTTP_200_OK
        return Response(body, status=code)


class TimeoutJobByKeyApi(APIView):
    """One job by its business key, the call a timeout center gets most ("order 123 was paid:
    cancel its close timeout"). ``GET`` answers the pending or running job of the key, else the
    latest one; ``DELETE`` cancels and ``PATCH`` moves the pending one. A job already firing
    is refused with 409 ``not_pending``: a cancel racing the firing has exactly one outcome."""

    permission_classes = [CanManageTimeouts]

    def _key(self, request) -> dict:
        key = TimeoutJobKeySerializer(data=request.query_params, context={"request": request})
        key.is_valid(raise_exception=True)
        return key.validated_data

    @extend_schema(
        parameters=KEY_PARAMETERS,
        responses={200: TimeoutJobOutputSerializer, **error_responses(400, 403, 404)},
    )
    def get(self, request):
        return Response(TimeoutJobOutputSerializer(self._job(self._key(request))).data)

    @extend_schema(
        parameters=KEY_PARAMETERS,
        request=None,
        responses={
            200: TimeoutJobOutputSerializer,
            409: NOT_PENDING,
            **error_responses(400, 403, 404),
        },
    )
    def delete(self, request):
        job = self._job(self._key(request))
        return Response(TimeoutJobOutputSerializer(services.timeout_job_cancel(job=job)).data)

    @extend_schema(
        parameters=KEY_PARAMETERS,
        request=TimeoutJobRescheduleSerializer,
        examples=[
            OpenApiExample(
                "Give the customer ten more minutes",
                value={"action_time": "2026-11-23T12:40:00Z"},
                request_only=True,
            )
        ],
        responses={
            200: TimeoutJobOutputSerializer,
            409: NOT_PENDING,
            **error_responses(400, 403, 404),
        },
    )
    def patch(self, request):
        key = self._key(request)
        data = TimeoutJobRescheduleSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        job = services.timeout_job_reschedule(
            job=self._job(key), action_time=data.validated_data["action_time"]
        )
        return Response(TimeoutJobOutputSerializer(job).data)

    def _job(self, key: dict) -> TimeoutJob:
        """The key's job (pending first); a cancel or a move of one that is not pending is
        refused by the services (``not_pending``)."""
        job = selectors.timeout_job_by_key(**key)
        if job is None:
            raise NotFound("No job for this business key.")
        return job


class TimeoutJobDetailApi(APIView):
    permission_classes = [CanManageTimeouts]

    @extend_schema(responses={200: TimeoutJobOutputSerializer, **error_responses(403, 404)})
    def get(self, request, job_id: int):
        job = _job_visible(request, get_object_or_404(TimeoutJob, pk=job_id))
        return Response(TimeoutJobOutputSerializer(job).data)

    @extend_schema(
        request=None,
        responses={
            200: TimeoutJobOutputSerializer,
            409: NOT_PENDING,
            **error_responses(403, 404),
        },
    )
    def delete(self, request, job_id: int):
        job = _job_visible(request, get_object_or_404(TimeoutJob, pk=job_id))
        job = services.timeout_job_cancel(job=job)
        return Response(TimeoutJobOutputSerializer(job).data)


NOT_LIVE = conflict_serializer("TimeoutJobEndConflict", ["not_live", "busy"])


class TimeoutJobEndApi(APIView):
    """Staff end a job that is pending or stuck ``running`` (a cancel refuses a running job): it
    is cancelled with who ended it and why in ``last_error`` and its history, and leaves the
    schedule. A worker still firing it cannot settle it afterwards. Needs staff status and the
    ``change_timeoutjob`` permission."""

    permission_classes = [staff_permissions(POST=("reminders.change_timeoutjob",))]

    @extend_schema(
        request=TimeoutJobEndSerializer,
        responses={
            200: TimeoutJobOutputSerializer,
            409: NOT_LIVE,
            **error_responses(400, 403, 404),
        },
    )
    def post(self, request, job_id: int):
        data = TimeoutJobEndSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        job = get_object_or_404(TimeoutJob, pk=job_id)
        job = services.timeout_job_end(
            job=job, reason=data.validated_data["reason"], by=request.user.get_username()
        )
        return Response(TimeoutJobOutputSerializer(job).data)
