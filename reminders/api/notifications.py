"""A user's inbox: list it, mark one or all read."""

from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.exceptions import NotFound
from rest_framework.response import Response
from rest_framework.views import APIView

from couponcenter.core.api.errors import error_responses
from couponcenter.core.api.pagination import Pagination, paginated_response
from couponcenter.core.api.permissions import ActsForUser
from reminders import selectors, services
from reminders.models import Notification


class NotificationOutputSerializer(serializers.ModelSerializer):
    class Meta:
        model = Notification
        fields = [
            "id",
            "user_id",
            "kind",
            "title",
            "body",
            "payload",
            "created_at",
            "visible_at",
            "read_at",
            "push",
            "held",
        ]
        extra_kwargs = {
            "push": {
                "help_text": "Pushed to the device; false: inbox only (over the per-user push cap)."
            },
            "held": {
                "help_text": "Over the cap and waiting to be folded into the user's next "
                "push (its `payload.digest`)."
            },
        }


class NotificationListApi(APIView):
    """The user's inbox, newest first: what is visible now (``visible_at`` has passed).
    A reminder pre-staged ahead of its due time is written earlier (``created_at``) and shows
    from ``visible_at``."""

    permission_classes = [ActsForUser]
    pagination_class = Pagination

    class FilterSerializer(serializers.Serializer):
        class Meta:
            ref_name = "NotificationListFilter"

        unread = serializers.BooleanField(
            required=False, default=False, help_text="Only notifications not read yet."
        )

    @extend_schema(
        operation_id="users_notifications_list",
        parameters=[FilterSerializer],
        responses={200: NotificationOutputSerializer(many=True), **error_responses(400, 403, 404)},
    )
    def get(self, request, user_id: int):
        f = self.FilterSerializer(data=request.query_params)
        f.is_valid(raise_exception=True)
        return paginated_response(
            queryset=selectors.notification_list(
                user_id=user_id, unread=f.validated_data["unread"]
            ),
            serializer_class=NotificationOutputSerializer,
            request=request,
            view=self,
        )


class NotificationReadApi(APIView):
    permission_classes = [ActsForUser]

    @extend_schema(
        operation_id="users_notifications_read",
        summary="Mark one notification read",
        request=None,
        responses={200: NotificationOutputSerializer, **error_responses(403, 404)},
        description="Idempotent: a notification read before keeps its first `read_at`.",
    )
    def post(self, request, user_id: int, notification_id: int):
        try:
            notification = services.notification_mark_read(
                user_id=user_id, notification_id=notification_id
            )
        except Notification.DoesNotExist:
            raise NotFound(f"No notification {notification_id} for this user.") from None
        return Response(NotificationOutputSerializer(notification).data)


class NotificationReadAllApi(APIView):
    permission_classes = [ActsForUser]

    class OutputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "NotificationReadAllOutput"

        marked = serializers.IntegerField(help_text="How many were unread until now.")
        read_at = serializers.DateTimeField()

    @extend_schema(
        operation_id="users_notifications_read_all",
        summary="Mark every visible notification read",
        request=None,
        responses={200: OutputSerializer, **error_responses(403, 404)},
    )
    def post(self, request, user_id: int):
        now = timezone.now()
        marked = services.notifications_mark_all_read(user_id=user_id, now=now)
        return Response(self.OutputSerializer({"marked": marked, "read_at": now}).data)
