"""The one signed-POST helper for every outbound call (the reminders' webhook gateway, ``http``
timeout topics).

A body is JSON bytes signed with HMAC-SHA256 (``X-Coupon-Center-Signature: sha256=<hex>``) and
sent with an ``Idempotency-Key``, so a receiver can check who sent it and absorb a redelivery.
Plain-HTTP targets are refused unless ``WEBHOOK_ALLOW_HTTP`` is on (development and tests).
"""

from __future__ import annotations

import hashlib
import hmac

import requests
from django.conf import settings

SIGNATURE_HEADER = "X-Coupon-Center-Signature"


def sign(secret: str, body: bytes) -> str:
    return hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def check_target(url: str, *, what: str = "target") -> None:
    """Raises ``ValueError`` for a target this service may not call."""
    if url.startswith("http://") and not settings.WEBHOOK_ALLOW_HTTP:
        raise ValueError(f"plain-HTTP {what} refused: {url} (set WEBHOOK_ALLOW_HTTP=1)")


def post_signed(
    url: str,
    body: bytes,
    *,
    secret: str,
    idempotency_key: str,
    session: requests.Session | None = None,
    what: str = "target",
) -> requests.Response:
    """POST ``body`` signed; raises ``ValueError`` (refused target) or ``requests``' errors (the
    call failed, or the receiver answered an error status)."""
    check_target(url, what=what)
    response = (session or requests).post(
        url,
        data=body,
        timeout=settings.WEBHOOK_TIMEOUT_S,
        headers={
            "Content-Type": "application/json",
            "Idempotency-Key": idempotency_key,
            SIGNATURE_HEADER: f"sha256={sign(secret, body)}",
        },
    )
    response.raise_for_status()
    return response
