"""Alerts: nothing goes dead silently (docs/architecture.md, invariant 8). An alert is a
structured ERROR log line and, when ``ALERT_WEBHOOK_URL`` is set (a chat channel's webhook), a
POST there."""

from __future__ import annotations

import logging
from typing import Any

import requests
from django.conf import settings

from couponcenter.core.webhooks import guarded_session, origin

logger = logging.getLogger(__name__)
ERROR_IN_TITLE = 200  # characters of the error in a headline; the details carry it whole


def raise_alert(*, title: str, details: dict[str, Any]) -> None:
    """A structured error log line, and a chat-friendly POST to ``ALERT_WEBHOOK_URL`` if set.
    The title names the topic and the first error when ``details`` has them: an operator who
    reads only the headline (a plain-text log, a chat notification) knows where to look."""
    title = headline(title, details)
    logger.error("ALERT %s", title, extra={"alert": title, **details})
    url = settings.ALERT_WEBHOOK_URL
    if not url:
        return
    text = f":rotating_light: {title}\n" + "\n".join(f"- {k}: {v}" for k, v in details.items())
    # A chat webhook's path is its secret: a failure names the scheme and host only, and no
    # redirect is followed. A refused alert must show in the log, not vanish.
    try:
        with guarded_session() as session:
            response = session.post(
                url,
                json={"text": text, "title": title, "details": details},
                timeout=settings.WEBHOOK_TIMEOUT_S,
                allow_redirects=False,
            )
        failure = f"HTTP {response.status_code}" if response.status_code >= 300 else ""
    except requests.RequestException as exc:
        failure = exc.__class__.__name__
    if failure:
        logger.error("alert webhook failed: %s from %s", failure, origin(url))


def headline(title: str, details: dict[str, Any]) -> str:
    """``title`` with the topic and the error of ``details``, as one line."""
    if details.get("topic"):
        title = f"{title} on {details['topic']}"
    if details.get("error"):
        title = f"{title}: {str(details['error'])[:ERROR_IN_TITLE]}"
    return title
