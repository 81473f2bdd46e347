"""A user's reminders: subscribe, unsubscribe, list."""

from django.shortcuts import get_object_or_404
from django.utils.timezone import now
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from couponcenter.core.api.errors import conflict_serializer, error_responses
from couponcenter.core.api.pagination import Pagination, paginated_response
from couponcenter.core.api.permissions import ActsForUser
from couponcenter.coupons.models import Coupon
from reminders import selectors, services
from reminders.models import ReminderSubscription


class SubscriptionOutputSerializer(serializers.ModelSerializer):
    """A pre-staged reminder (in the inbox, hidden until its due time) still reads as
    ``scheduled``, with no ``sent_at``: the user has not been reminded yet, and may still
    unsubscribe."""

    coupon_name = serializers.CharField(source="coupon.name", read_only=True)

    def to_representation(self, instance):
        data = super().to_representation(instance)
        sent_at = instance.sent_at
        if instance.status == ReminderSubscription.Status.SENT and sent_at and sent_at > now():
            data["status"], data["sent_at"] = ReminderSubscription.Status.SCHEDULED.value, None
        return data

    class Meta:
        model = ReminderSubscription
        fields = [
            "id",
            "coupon",
            "coupon_name",
            "user_id",
            "remind_at",
            "status",
            "drop_reason",
            "sent_at",
            "created_at",
        ]


class SubscriptionListApi(APIView):
    permission_classes = [ActsForUser]
    pagination_class = Pagination

    @extend_schema(
        responses={200: SubscriptionOutputSerializer(many=True), **error_responses(400, 403, 404)}
    )
    def get(self, request, user_id: int):
        return paginated_response(
            queryset=selectors.subscription_list(user_id=user_id),
            serializer_class=SubscriptionOutputSerializer,
            request=request,
            view=self,
        )


class SubscriptionDetailApi(APIView):
    permission_classes = [ActsForUser]

    @extend_schema(
        request=None,
        responses={
            200: SubscriptionOutputSerializer,
            201: SubscriptionOutputSerializer,
            409: conflict_serializer("SubscribeConflict", ["cancelled", "closed", "already_open"]),
            **error_responses(403, 404),
        },
        description="Subscribe (idempotent): 201 when created, 200 when it already existed. "
        "409 codes: cancelled, closed, already_open.",
    )
    def put(self, request, user_id: int, coupon_id: int):
        coupon = get_object_or_404(Coupon, pk=coupon_id)
        sub, created = services.subscription_subscribe(user_id=user_id, coupon=coupon)
        return Response(
            SubscriptionOutputSerializer(sub).data,
            status=status.HTTP_201_CREATED if created else status.HTTP_200_OK,
        )

    @extend_schema(request=None, responses={204: None, **error_responses(403, 404)})
    def delete(self, request, user_id: int, coupon_id: int):
        get_object_or_404(Coupon, pk=coupon_id)
        services.subscription_unsubscribe(user_id=user_id, coupon_id=coupon_id)
        return Response(status=status.HTTP_204_NO_CONTENT)
