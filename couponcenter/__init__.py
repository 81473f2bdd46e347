"""Coupon Center: the Django project (settings, URLs, Celery: wiring only) and the coupon domain.

The kernel is ``couponcenter.core``, the operations console ``couponcenter.ops``.
"""

from .celery import app as celery_app
from .core import __version__

__all__ = ("__version__", "celery_app")
