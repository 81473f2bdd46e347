"""Verifying captured deliveries with the official Standard Webhooks libraries, as receivers do:
PyPI ``standardwebhooks`` in this process, npm ``standardwebhooks`` in ``node``
(``standardwebhooks_verify.mjs``). Each answers None (accepted) or the library's refusal.

A secret without the ``whsec_`` prefix is handed to both as raw bytes (its UTF-8 text), as
docs/timeouts.md tells receivers of a topic whose secret predates the prefix."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
import standardwebhooks.webhooks
from standardwebhooks import Webhook, WebhookVerificationError

from couponcenter.core.webhooks import SECRET_PREFIX
from reminders.bench.peers import npm_package

NODE_LIBRARY_VERSION = "1.1.1"
SCRIPT = Path(__file__).with_name("standardwebhooks_verify.mjs")


@dataclass(frozen=True)
class Check:
    """One verification: a delivery's body and headers, checked with ``secret`` ``later_s``
    seconds after now."""

    secret: str
    headers: Mapping[str, str]
    body: bytes
    later_s: int = 0


def _webhook(secret: str) -> Webhook:
    return Webhook(secret if secret.startswith(SECRET_PREFIX) else secret.encode())


def verify_python(check: Check) -> str | None:
    library = standardwebhooks.webhooks
    real = library.datetime
    if check.later_s:  # the library reads the time from its module's ``datetime``

        class Later(real):
            @classmethod
            def now(cls, tz=None):
                return real.now(tz) + timedelta(seconds=check.later_s)

        library.datetime = Later
    try:
        _webhook(check.secret).verify(check.body, dict(check.headers))
    except WebhookVerificationError as refused:
        return f"WebhookVerificationError: {refused}"
    finally:
        library.datetime = real
    return None


def verify_node(checks: Sequence[Check]) -> list[str | None]:
    folder, why = npm_package("standardwebhooks", NODE_LIBRARY_VERSION)
    if folder is None:
        pytest.skip(why)
    cases = [
        {
            "secret": c.secret,
            "raw": not c.secret.startswith(SECRET_PREFIX),
            "body": c.body.decode(),
            "headers": dict(c.headers),
            "later_s": c.later_s,
        }
        for c in checks
    ]
    done = subprocess.run(
        [shutil.which("node"), str(SCRIPT), str(folder)],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(done.stdout)


def verify_both(checks: Sequence[Check]) -> dict[str, list[str | None]]:
    """Each library's answer to each check, by library."""
    return {"python": [verify_python(c) for c in checks], "node": verify_node(checks)}
