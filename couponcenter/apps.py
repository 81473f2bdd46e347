from django.apps import AppConfig


class CouponCenterConfig(AppConfig):
    name = "couponcenter"
    verbose_name = "Coupons"
