from django.urls import path

from couponcenter.core.api import converters  # noqa: F401  (registers the "id" path converter)
from couponcenter.coupons.api import accounts, auth, claims, coupons

urlpatterns = [
    # First: the claim is the request a rush sends, and no other pattern here matches its paths,
    # so the order costs nothing else.
    path(
        "users/<id:user_id>/coupons/", claims.UserCouponListApi.as_view(), name="user-coupon-list"
    ),
    path("auth/token/", auth.TokenApi.as_view(), name="api-token"),
    path("auth/token/revoke/", auth.TokenRevokeApi.as_view(), name="api-token-revoke"),
    path("accounts/", accounts.AccountApi.as_view(), name="account-ensure"),
    path(
        "accounts/token/revoke/",
        accounts.AccountTokenRevokeApi.as_view(),
        name="account-token-revoke",
    ),
    path("coupons/", coupons.CouponListApi.as_view(), name="coupon-list"),
    path("coupons/<id:coupon_id>/", coupons.CouponDetailApi.as_view(), name="coupon-detail"),
    path("coupons/<id:coupon_id>/cancel/", coupons.CouponCancelApi.as_view(), name="coupon-cancel"),
    path(
        "users/<id:user_id>/coupons/<id:user_coupon_id>/redeem/",
        claims.UserCouponRedeemApi.as_view(),
        name="user-coupon-redeem",
    ),
]
