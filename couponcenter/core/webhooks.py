"""The one signed-POST helper for every outbound call (the reminders' webhook gateway, ``http``
timeout topics; alerts use ``guarded_session`` too).

A body is JSON bytes signed with HMAC-SHA256 over ``"<timestamp>." + body``
(``X-Coupon-Center-Signature: sha256=<hex>``, ``X-Coupon-Center-Timestamp: <unix seconds>``) and
sent with an ``Idempotency-Key``, so a receiver can check who sent it, reject a replay of an old
request (``verify``'s tolerance) and absorb a redelivery (README, "Verifying a webhook").

Refused targets:
- plain HTTP unless ``WEBHOOK_ALLOW_HTTP`` is on (development and tests), whatever the case of the
  scheme;
- private, loopback, link-local and other non-public addresses unless ``WEBHOOK_ALLOW_PRIVATE`` is
  on (README, Security: "Outbound calls"), checked before any connection is made
  (``guarded_session``): the host is resolved once, every address it resolves to must be public, and
  the socket connects to those checked addresses only, so a name re-pointed after the check changes
  nothing. A refused target never sees a connection and every refusal reads the same, so an open, a
  closed and an unreachable internal port cannot be told apart (no port scan through
  ``last_error``);
- a redirect is a failure and is never followed (following it would re-send the body, the
  signature and the idempotency key to wherever it points).

A failure names the target by its scheme and host only: a webhook's path and query often are its
secret, and the message ends up in logs, ``last_error`` columns and the API.
"""

from __future__ import annotations

import collections
import functools
import hashlib
import hmac
import ipaddress
import socket
import time
from urllib.parse import urlsplit

import requests
import urllib3
from django.conf import settings
from requests.adapters import HTTPAdapter
from urllib3.exceptions import ConnectTimeoutError, NameResolutionError, NewConnectionError
from urllib3.util.connection import allowed_gai_family
from urllib3.util.timeout import _DEFAULT_TIMEOUT

SIGNATURE_HEADER = "X-Coupon-Center-Signature"
TIMESTAMP_HEADER = "X-Coupon-Center-Timestamp"
# A receiver should refuse a request signed longer ago than this (a replay).
REPLAY_TOLERANCE_S = 300
# A signing key shorter than this can be guessed; an empty one lets anyone forge a request.
MIN_SECRET_BYTES = 32
# A long key is guessable too when it is made of few characters, repeats a shorter unit or runs
# along the alphabet (most neighbours the same step apart). The bounds leave every random key
# of 32 bytes or more as the example makes it, and 32 random hex digits, well clear of them.
MIN_SECRET_DISTINCT_CHARS = 8
MAX_SECRET_STEP_SHARE = 0.5
_MAKE_ONE = "for example: python -c 'import secrets; print(secrets.token_urlsafe(32))'"


def secret_problem(secret: str, *, what: str) -> str | None:
    """Why ``secret`` may not sign outbound calls (None: it may): the one rule for every
    signing secret (topic rows, settings topics, the webhook gateway, each outbound call)."""
    size = len(secret.encode())
    if size < MIN_SECRET_BYTES:
        state = "is empty" if not size else f"has {size} bytes"
        need = f"a signing secret needs at least {MIN_SECRET_BYTES} bytes"
        return f"{what} {state}: {need} ({_MAKE_ONE})"
    weakness = _secret_weakness(secret)
    if weakness:
        return f"{what} is guessable: {weakness}; use a random one ({_MAKE_ONE})"
    return None


@functools.lru_cache(maxsize=256)  # checked before every outbound call; a process has few
def _secret_weakness(secret: str) -> str | None:
    distinct = len(set(secret))
    if distinct < MIN_SECRET_DISTINCT_CHARS:
        return f"{distinct} distinct characters (at least {MIN_SECRET_DISTINCT_CHARS})"
    unit = _shortest_period(secret)
    if unit <= len(secret) // 2:
        return f"it repeats a unit of {unit} characters"
    steps = collections.Counter(ord(b) - ord(a) for a, b in zip(secret, secret[1:], strict=False))
    if steps.most_common(1)[0][1] > MAX_SECRET_STEP_SHARE * (len(secret) - 1):
        return "it runs along the alphabet (most neighbours the same step apart)"
    return None


def _shortest_period(text: str) -> int:
    """The least p with text[i] == text[i - p] for every i >= p (the prefix function)."""
    border = [0] * len(text)
    for i in range(1, len(text)):
        k = border[i - 1]
        while k and text[i] != text[k]:
            k = border[k - 1]
        border[i] = k + 1 if text[i] == text[k] else 0
    return len(text) - border[-1]


def sign(secret: str, body: bytes, timestamp: int) -> str:
    message = str(timestamp).encode() + b"." + body
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def verify(
    secret: str,
    body: bytes,
    signature: str,
    timestamp: str,
    *,
    now: float | None = None,
    tolerance_s: int = REPLAY_TOLERANCE_S,
) -> bool:
    """What a receiver does with the two headers: the signature must match the body and the
    timestamp, and the timestamp must be recent (both ways: a clock running ahead is no
    excuse)."""
    if not timestamp.isdigit() or not signature.startswith("sha256="):
        return False
    age = (time.time() if now is None else now) - int(timestamp)
    if abs(age) > tolerance_s:
        return False
    expected = sign(secret, body, int(timestamp))
    return hmac.compare_digest(signature.removeprefix("sha256="), expected)


class OutboundCallFailed(requests.RequestException):
    """An outbound call failed; the message names the target's scheme and host only."""


def origin(url: str) -> str:
    """``scheme://host[:port]`` of ``url``: what may be logged or stored about a target."""
    parts = urlsplit(url)
    return f"{parts.scheme.lower()}://{parts.hostname or ''}" + (
        f":{parts.port}" if parts.port else ""
    )


class PrivateAddressRefused(OSError):
    """The target's address is not public and ``WEBHOOK_ALLOW_PRIVATE`` is off."""


def address_refused(address: str) -> bool:
    """True for an address outbound calls may not reach (unless WEBHOOK_ALLOW_PRIVATE)."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    return not ip.is_global or ip.is_multicast


# The one text of a refused address: it names neither the address nor the port, nor says whether
# anything answers there.
REFUSED_ADDRESS = "not a public address"


def _checked_addresses(host: str, port: int) -> list[tuple]:
    """``getaddrinfo``'s answers for ``host``, all of them public (else ``PrivateAddressRefused``):
    a name with one internal address among public ones is refused whole."""
    found = socket.getaddrinfo(host.strip("[]"), port, allowed_gai_family(), socket.SOCK_STREAM)
    if any(address_refused(sockaddr[0]) for *_, sockaddr in found):
        raise PrivateAddressRefused(REFUSED_ADDRESS)
    return found


def _connect(found: list[tuple], timeout, source_address, socket_options) -> socket.socket:
    """urllib3's ``create_connection`` over addresses resolved (and checked) already."""
    error: OSError | None = None
    for family, kind, proto, _, sockaddr in found:
        sock = socket.socket(family, kind, proto)
        try:
            for option in socket_options or ():
                sock.setsockopt(*option)
            if timeout is not _DEFAULT_TIMEOUT:
                sock.settimeout(timeout)
            if source_address:
                sock.bind(source_address)
            sock.connect(sockaddr)
            return sock
        except OSError as exc:
            error = exc
            sock.close()
    raise error or OSError("getaddrinfo returned no address")


class _GuardedConnection:
    """Resolves the host, checks every address and connects to the checked ones only (mixed into
    urllib3's connections; TLS still verifies and sends the host name: only the socket is ours)."""

    def _new_conn(self):
        if settings.WEBHOOK_ALLOW_PRIVATE:
            return super()._new_conn()
        try:
            found = _checked_addresses(self._dns_host, self.port)
            return _connect(found, self.timeout, self.source_address, self.socket_options)
        except PrivateAddressRefused:
            raise
        except (socket.gaierror, UnicodeError) as exc:  # UnicodeError: a label IDNA refuses
            raise NameResolutionError(self.host, self, exc) from exc
        except TimeoutError as exc:
            raise ConnectTimeoutError(
                self, f"Connection to {self.host} timed out. (connect timeout={self.timeout})"
            ) from exc
        except OSError as exc:
            raise NewConnectionError(self, f"Failed to establish a new connection: {exc}") from exc


class _GuardedHTTPConnection(_GuardedConnection, urllib3.connection.HTTPConnection):
    pass


class _GuardedHTTPSConnection(_GuardedConnection, urllib3.connection.HTTPSConnection):
    pass


class _GuardedHTTPPool(urllib3.HTTPConnectionPool):
    ConnectionCls = _GuardedHTTPConnection


class _GuardedHTTPSPool(urllib3.HTTPSConnectionPool):
    ConnectionCls = _GuardedHTTPSConnection


class _GuardedAdapter(HTTPAdapter):
    def init_poolmanager(self, *args, **kwargs):
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = {
            "http": _GuardedHTTPPool,
            "https": _GuardedHTTPSPool,
        }


def guarded_session(*, pool_size: int = 10) -> requests.Session:
    """A ``requests.Session`` whose connections refuse non-public addresses (checked on the
    resolved addresses, before connecting). No proxies from the environment: a proxy would be
    the peer, and the target behind it unchecked."""
    session = requests.Session()
    session.trust_env = False
    adapter = _GuardedAdapter(pool_connections=pool_size, pool_maxsize=pool_size)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


def _refused_private(exc: BaseException) -> str | None:
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, PrivateAddressRefused):
            return str(exc)
        for nested in (getattr(exc, "reason", None), *exc.args):
            if isinstance(nested, BaseException):
                found = _refused_private(nested)
                if found:
                    return found
        exc = exc.__cause__ or exc.__context__
    return None


def plain_http_allowed(*, allow_http: bool = False) -> bool:
    """The one rule for plain-HTTP targets: allowed for every target with
    ``WEBHOOK_ALLOW_HTTP`` (on under ``make run``), else only where a topic's own ``allow_http``
    says so. Checked when a topic is saved and again before every call."""
    return allow_http or settings.WEBHOOK_ALLOW_HTTP


def check_target(url: str, *, what: str = "target", allow_http: bool = False) -> None:
    """Raises ``ValueError`` for a target this service may not call (``allow_http``: this
    target may be plain HTTP, as a topic's operator allowed, whatever ``WEBHOOK_ALLOW_HTTP``)."""
    if urlsplit(url).scheme.lower() == "http" and not plain_http_allowed(allow_http=allow_http):
        raise ValueError(f"plain-HTTP {what} refused: {origin(url)} (set WEBHOOK_ALLOW_HTTP=1)")


def post_signed(
    url: str,
    body: bytes,
    *,
    secret: str,
    idempotency_key: str,
    session: requests.Session | None = None,
    what: str = "target",
    timeout_s: float | None = None,
    allow_http: bool = False,
) -> requests.Response:
    """POST ``body`` signed (``session``: a ``guarded_session()`` to reuse its connections).

    Raises ``ValueError`` (refused target or secret) or ``OutboundCallFailed`` (the call failed,
    a non-public address was refused, or the receiver answered a redirect or an error status).
    """
    check_target(url, what=what, allow_http=allow_http)
    problem = secret_problem(secret, what=f"the secret of {origin(url)}")
    if problem:
        raise ValueError(problem)
    timestamp = int(time.time())
    own = session is None
    session = session or guarded_session()
    try:
        response = session.post(
            url,
            data=body,
            timeout=settings.WEBHOOK_TIMEOUT_S if timeout_s is None else timeout_s,
            allow_redirects=False,
            headers={
                "Content-Type": "application/json",
                "Idempotency-Key": idempotency_key,
                SIGNATURE_HEADER: f"sha256={sign(secret, body, timestamp)}",
                TIMESTAMP_HEADER: str(timestamp),
            },
        )
    except requests.RequestException as exc:
        refused = _refused_private(exc)
        if refused:
            raise OutboundCallFailed(
                f"{what} {origin(url)} refused: {refused} (set WEBHOOK_ALLOW_PRIVATE=1)"
            ) from None
        raise OutboundCallFailed(f"{exc.__class__.__name__} calling {origin(url)}") from None
    finally:
        if own:
            session.close()
    if response.status_code >= 300:
        kind = "redirect (not followed)" if response.status_code < 400 else "error"
        raise OutboundCallFailed(f"HTTP {response.status_code} {kind} from {origin(url)}")
    return response
