"""The coupon catalogue: list, detail (any caller); create, change, cancel (``manage_coupons``)."""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.permissions import BasePermission, IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from couponcenter.core.api.errors import conflict_serializer, error_responses
from couponcenter.core.api.fields import AwareDateTimeField, IsoDurationField
from couponcenter.core.api.pagination import Pagination, paginated_response
from couponcenter.core.api.permissions import CanManageCoupons
from couponcenter.core.api.schema import COUPON_ID
from couponcenter.coupons import selectors, services
from couponcenter.coupons.models import MAX_PER_USER_LIMIT, MAX_TOTAL_STOCK, Coupon


class CouponOutputSerializer(serializers.ModelSerializer):
    valid_for = IsoDurationField(read_only=True, allow_null=True)
    reminder_lead = IsoDurationField(read_only=True)
    remaining_stock = serializers.IntegerField(read_only=True)

    class Meta:
        model = Coupon
        fields = [
            "id",
            "name",
            "description",
            "claim_opens_at",
            "claim_closes_at",
            "total_stock",
            "claimed_count",
            "remaining_stock",
            "per_user_limit",
            "expires_at",
            "valid_for",
            "reminder_lead",
            "reminder_priority",
            "status",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields


class CouponInputSerializer(serializers.Serializer):
    """The writable fields of a coupon (all optional in a PATCH)."""

    name = serializers.CharField(max_length=200)
    description = serializers.CharField(required=False, allow_blank=True, max_length=10_000)
    claim_opens_at = AwareDateTimeField()
    claim_closes_at = AwareDateTimeField(required=False, allow_null=True)
    total_stock = serializers.IntegerField(min_value=1, max_value=MAX_TOTAL_STOCK)
    per_user_limit = serializers.IntegerField(
        min_value=1, max_value=MAX_PER_USER_LIMIT, required=False
    )
    expires_at = AwareDateTimeField(
        required=False, allow_null=True, help_text="A fixed end of validity (or give valid_for)."
    )
    valid_for = IsoDurationField(
        required=False,
        allow_null=True,
        help_text='Validity counted from each claim, ISO 8601 (e.g. "P7D"); or give expires_at.',
    )
    reminder_lead = IsoDurationField(
        required=False, help_text='How long before opening the reminder goes out ("PT60S").'
    )
    reminder_priority = serializers.ChoiceField(choices=Coupon.Priority.choices, required=False)


class CouponListApi(APIView):
    pagination_class = Pagination

    class FilterSerializer(serializers.Serializer):
        upcoming = serializers.BooleanField(required=False, allow_null=True, default=None)
        claimable = serializers.BooleanField(required=False, allow_null=True, default=None)

    def get_permissions(self) -> list[BasePermission]:
        if self.request.method == "POST":
            return [CanManageCoupons()]
        return [IsAuthenticated()]

    @extend_schema(
        operation_id="coupons_list",
        parameters=[
            OpenApiParameter("upcoming", OpenApiTypes.BOOL, description="Not yet open."),
            OpenApiParameter("claimable", OpenApiTypes.BOOL, description="Claimable now."),
        ],
        responses={200: CouponOutputSerializer(many=True), **error_responses(400, 404)},
    )
    def get(self, request: Request) -> Response:
        filters = self.FilterSerializer(data=request.query_params)
        filters.is_valid(raise_exception=True)
        return paginated_response(
            queryset=selectors.coupon_list(**filters.validated_data),
            serializer_class=CouponOutputSerializer,
            request=request,
            view=self,
        )

    @extend_schema(
        operation_id="coupons_create",
        request=CouponInputSerializer,
        responses={201: CouponOutputSerializer, **error_responses(400, 403)},
    )
    def post(self, request: Request) -> Response:
        data = CouponInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        fields = {k: v for k, v in data.validated_data.items() if v is not None}
        coupon = services.coupon_create(**fields)
        return Response(CouponOutputSerializer(coupon).data, status=status.HTTP_201_CREATED)


class CouponDetailApi(APIView):
    def get_permissions(self) -> list[BasePermission]:
        if self.request.method == "PATCH":
            return [CanManageCoupons()]
        return [IsAuthenticated()]

    @extend_schema(
        operation_id="coupons_retrieve",
        parameters=[COUPON_ID],
        responses={200: CouponOutputSerializer, **error_responses(404)},
    )
    def get(self, request: Request, coupon_id: int) -> Response:
        coupon = get_object_or_404(Coupon, pk=coupon_id)
        return Response(CouponOutputSerializer(coupon).data)

    @extend_schema(
        operation_id="coupons_partial_update",
        parameters=[COUPON_ID],
        request=CouponInputSerializer(partial=True),
        responses={
            200: CouponOutputSerializer,
            409: conflict_serializer("CouponChangeConflict", ["cancelled"]),
            **error_responses(400, 403, 404),
        },
        description="Change a coupon. Moving its opening time moves its reminders. "
        "409 `cancelled`: a cancelled coupon cannot be changed.",
    )
    def patch(self, request: Request, coupon_id: int) -> Response:
        coupon = get_object_or_404(Coupon, pk=coupon_id)
        data = CouponInputSerializer(data=request.data, partial=True)
        data.is_valid(raise_exception=True)
        coupon = services.coupon_update(coupon=coupon, **data.validated_data)
        return Response(CouponOutputSerializer(coupon).data)


class CouponCancelApi(APIView):
    permission_classes = [CanManageCoupons]

    @extend_schema(
        operation_id="coupons_cancel",
        parameters=[COUPON_ID],
        request=None,
        responses={200: CouponOutputSerializer, **error_responses(403, 404)},
        description="Cancel a coupon: no more claims, its reminders are cancelled. Idempotent.",
    )
    def post(self, request: Request, coupon_id: int) -> Response:
        coupon = get_object_or_404(Coupon, pk=coupon_id)
        coupon = services.coupon_cancel(coupon=coupon)
        return Response(CouponOutputSerializer(coupon).data)
