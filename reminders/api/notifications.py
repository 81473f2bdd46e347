"""A user's inbox."""

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.views import APIView

from couponcenter.api.pagination import Pagination
from couponcenter.api.permissions import ActsForUser
from reminders import selectors
from reminders.models import Notification


class NotificationOutputSerializer(serializers.ModelSerializer):
    class Meta:
        model = Notification
        fields = ["id", "user_id", "kind", "title", "body", "payload", "created_at", "read_at"]


class NotificationListApi(APIView):
    permission_classes = [ActsForUser]

    @extend_schema(responses=NotificationOutputSerializer(many=True))
    def get(self, request, user_id: int):
        notifications = selectors.notification_list(user_id=user_id)
        paginator = Pagination()
        page = paginator.paginate_queryset(notifications, request, view=self)
        return paginator.get_paginated_response(NotificationOutputSerializer(page, many=True).data)
