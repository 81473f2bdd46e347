from django.urls import path, register_converter

from couponcenter.api import auth, claims, coupons


class BigIntConverter:
    """Non-negative ids that fit a BIGINT: anything longer is a 404, never a database error."""

    regex = "[0-9]{1,18}"

    def to_python(self, value: str) -> int:
        return int(value)

    def to_url(self, value: int) -> str:
        return str(value)


register_converter(BigIntConverter, "id")

urlpatterns = [
    path("auth/token/", auth.TokenApi.as_view(), name="api-token"),
    path("coupons/", coupons.CouponListApi.as_view(), name="coupon-list"),
    path("coupons/<id:coupon_id>/", coupons.CouponDetailApi.as_view(), name="coupon-detail"),
    path("coupons/<id:coupon_id>/cancel/", coupons.CouponCancelApi.as_view(), name="coupon-cancel"),
    path(
        "users/<id:user_id>/coupons/", claims.UserCouponListApi.as_view(), name="user-coupon-list"
    ),
    path(
        "users/<id:user_id>/coupons/<id:user_coupon_id>/redeem/",
        claims.UserCouponRedeemApi.as_view(),
        name="user-coupon-redeem",
    ),
]
