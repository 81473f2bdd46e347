"""Sign-in security: every lockout of django-axes (too many failed logins for a username or from
an address) is logged as a warning, with the username and the client address."""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)


def log_lockout(
    sender: Any, request: Any = None, username: str = "", ip_address: str = "", **kwargs: Any
) -> None:
    logger.warning(
        "login locked out: username %r from %s",
        username,
        ip_address,
        extra={"username": username, "ip_address": ip_address},
    )
