"""The coupon domain: coupons, their stock and claims, accounts, and the API and admin over them.

Its app label is ``couponcenter`` (``apps.py``): the tables (``couponcenter_coupon``, ...), the
migration history and the permissions (``couponcenter.manage_coupons``) are keyed by it.
"""
