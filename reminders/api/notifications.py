"""A user's inbox."""

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.views import APIView

from couponcenter.core.api.errors import error_responses
from couponcenter.core.api.pagination import Pagination, paginated_response
from couponcenter.core.api.permissions import ActsForUser
from reminders import selectors
from reminders.models import Notification


class NotificationOutputSerializer(serializers.ModelSerializer):
    class Meta:
        model = Notification
        fields = [
            "id", "user_id", "kind", "title", "body", "payload", "created_at", "visible_at",
            "read_at",
        ]  # fmt: skip


class NotificationListApi(APIView):
    """The user's inbox, newest first: what is visible now (``visible_at`` has passed).
    A reminder pre-staged ahead of its due time is written earlier (``created_at``) and shows
    from ``visible_at``."""

    permission_classes = [ActsForUser]
    pagination_class = Pagination

    @extend_schema(
        responses={200: NotificationOutputSerializer(many=True), **error_responses(400, 403, 404)}
    )
    def get(self, request, user_id: int):
        return paginated_response(
            queryset=selectors.notification_list(user_id=user_id),
            serializer_class=NotificationOutputSerializer,
            request=request,
            view=self,
        )
