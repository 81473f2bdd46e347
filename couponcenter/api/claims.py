"""A user's coupons: claim, list, redeem. The caller must be allowed to act for ``user_id``."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.throttling import BaseThrottle
from rest_framework.views import APIView

from couponcenter import selectors, services
from couponcenter.api.errors import conflict_serializer, error_responses
from couponcenter.api.pagination import Pagination, paginated_response
from couponcenter.api.permissions import ActsForUser
from couponcenter.api.schema import USER_COUPON_ID, USER_ID
from couponcenter.api.throttling import FixedWindowScopedThrottle
from couponcenter.models import Coupon, UserCoupon

CLAIM_REFUSALS = ["sold_out", "limit_reached", "not_open", "closed", "cancelled"]
REDEEM_REFUSALS = ["expired", "already_used"]


class UserCouponOutputSerializer(serializers.Serializer):
    # Declared, not a ModelSerializer: building a ModelSerializer's fields from the model costs
    # more than the rest of a claim request.
    id = serializers.IntegerField(read_only=True)
    coupon = serializers.IntegerField(source="coupon_id", read_only=True)
    coupon_name = serializers.CharField(source="coupon.name", read_only=True)
    user_id = serializers.IntegerField(read_only=True)
    status = serializers.ChoiceField(choices=UserCoupon.Status.choices, read_only=True)
    claimed_at = serializers.DateTimeField(read_only=True)
    expires_at = serializers.DateTimeField(read_only=True)
    used_at = serializers.DateTimeField(read_only=True, allow_null=True)


class UserCouponListApi(APIView):
    permission_classes = [ActsForUser]
    pagination_class = Pagination

    class FilterSerializer(serializers.Serializer):
        status = serializers.ChoiceField(choices=UserCoupon.Status.choices, required=False)

    class ClaimInputSerializer(serializers.Serializer):
        coupon = serializers.IntegerField(min_value=1, max_value=2**63 - 1)

    def get_throttles(self) -> list[BaseThrottle]:
        if self.request.method == "POST":
            self.throttle_scope = "claim"
            return [FixedWindowScopedThrottle()]
        return super().get_throttles()

    @extend_schema(
        operation_id="users_coupons_list",
        parameters=[USER_ID, OpenApiParameter("status", str, enum=UserCoupon.Status.values)],
        responses={200: UserCouponOutputSerializer(many=True), **error_responses(400, 403, 404)},
        description="The coupons a user claimed, newest first.",
    )
    def get(self, request: Request, user_id: int) -> Response:
        filters = self.FilterSerializer(data=request.query_params)
        filters.is_valid(raise_exception=True)
        return paginated_response(
            queryset=selectors.user_coupon_list(user_id=user_id, **filters.validated_data),
            serializer_class=UserCouponOutputSerializer,
            request=request,
            view=self,
        )

    @extend_schema(
        operation_id="users_coupons_claim",
        parameters=[USER_ID],
        request=ClaimInputSerializer,
        responses={
            201: UserCouponOutputSerializer,
            409: conflict_serializer("ClaimConflict", CLAIM_REFUSALS),
            **error_responses(400, 403, 404, 429),
        },
        description="Claim a coupon for the user. 409 codes: " + ", ".join(CLAIM_REFUSALS) + ".",
    )
    def post(self, request: Request, user_id: int) -> Response:
        data = self.ClaimInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        coupon_id = data.validated_data["coupon"]
        try:
            user_coupon = services.coupon_claim(coupon_id=coupon_id, user_id=user_id)
        except Coupon.DoesNotExist:
            raise serializers.ValidationError(
                {"coupon": [f"No coupon with id {coupon_id}."]}
            ) from None
        return Response(
            UserCouponOutputSerializer(user_coupon).data, status=status.HTTP_201_CREATED
        )


class UserCouponRedeemApi(APIView):
    permission_classes = [ActsForUser]

    @extend_schema(
        operation_id="users_coupons_redeem",
        parameters=[USER_ID, USER_COUPON_ID],
        request=None,
        responses={
            200: UserCouponOutputSerializer,
            409: conflict_serializer("RedeemConflict", REDEEM_REFUSALS),
            **error_responses(403, 404),
        },
        description="Use a claimed coupon. 409 codes: " + ", ".join(REDEEM_REFUSALS) + ".",
    )
    def post(self, request: Request, user_id: int, user_coupon_id: int) -> Response:
        try:
            user_coupon = services.coupon_redeem(user_coupon_id=user_coupon_id, user_id=user_id)
        except UserCoupon.DoesNotExist:
            raise NotFound("This user holds no such coupon.") from None
        return Response(UserCouponOutputSerializer(user_coupon).data)
