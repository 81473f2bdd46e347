"""Coupon Center: the Django project's wiring (settings, URLs, Celery, WSGI and ASGI).

The kernel is ``couponcenter.core``, the coupon domain ``couponcenter.coupons``, the operations
console ``couponcenter.ops``.
"""

from .celery import app as celery_app
from .core import __version__

__all__ = ("__version__", "celery_app")
