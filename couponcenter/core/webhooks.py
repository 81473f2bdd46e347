"""The one signed-POST helper for every outbound call (the reminders' webhook gateway, ``http``
timeout topics; alerts use ``guarded_session`` too).

A body is JSON bytes signed as the Standard Webhooks specification says, so a receiver verifies
it with the official ``standardwebhooks`` library of its language (README, "Verifying a webhook"):
``webhook-id`` (the call's idempotency key, the same on every retry; also sent as
``Idempotency-Key``), ``webhook-timestamp`` (unix seconds, which the libraries hold to five
minutes: a replay is refused) and ``webhook-signature: v1,<base64 HMAC-SHA256 of
"<id>.<timestamp>.<body>">``, one signature per secret, space-separated: while a secret is being
rotated the old and the new one both sign, so a receiver holding either verifies.

A secret is ``whsec_<base64>`` (the key is the decoded bytes) or, for secrets set before, any
other text, whose UTF-8 bytes are the key: ``whsec_`` + base64 of that text is the same key
(docs/timeouts.md, "Signatures"). Our older headers (``X-Coupon-Center-Signature:
sha256=<hex>``, ``X-Coupon-Center-Timestamp``) are added only for a target that asks for them.

Refused targets:
- plain HTTP unless ``WEBHOOK_ALLOW_HTTP`` is on (development and tests), whatever the case of the
  scheme;
- private, loopback, link-local and other non-public addresses unless ``WEBHOOK_ALLOW_PRIVATE`` is
  on (README, Security: "Outbound calls"), checked before any connection is made
  (``OutboundPool`` for signed POSTs, ``guarded_session`` for alerts): the host is resolved once,
  every address it resolves to must be public, and the socket connects to those checked
  addresses only, so a name re-pointed after the check changes nothing. A refused target never
  sees a connection and every refusal reads the same, so an open, a closed and an unreachable
  internal port cannot be told apart (no port scan through ``last_error``);
- a redirect is a failure and is never followed (following it would re-send the body, the
  signature and the idempotency key to wherever it points).

A failure names the target by its scheme and host only: a webhook's path and query often are its
secret, and the message ends up in logs, ``last_error`` columns and the API.
"""

from __future__ import annotations

import base64
import binascii
import collections
import functools
import hashlib
import hmac
import http.client
import ipaddress
import socket
import ssl
import threading
import time
from collections.abc import Sequence
from urllib.parse import urlsplit

import certifi
import requests
import urllib3
from django.conf import settings
from requests.adapters import HTTPAdapter
from urllib3.exceptions import ConnectTimeoutError, NameResolutionError, NewConnectionError
from urllib3.util.connection import allowed_gai_family
from urllib3.util.timeout import _DEFAULT_TIMEOUT
from urllib3.util.wait import wait_for_read

ID_HEADER = "webhook-id"
TIMESTAMP_HEADER = "webhook-timestamp"
SIGNATURE_HEADER = "webhook-signature"
LEGACY_SIGNATURE_HEADER = "X-Coupon-Center-Signature"
LEGACY_TIMESTAMP_HEADER = "X-Coupon-Center-Timestamp"
SECRET_PREFIX = "whsec_"
# A signing secret written as text shorter than this can be guessed; an empty one lets anyone
# forge a request.
MIN_SECRET_BYTES = 32
# A whsec_ key is random bytes: the specification's floor, as many random bits (192) as 32
# url-safe characters hold.
MIN_KEY_BYTES = 24
# A long key is guessable too when it is made of few characters, repeats a shorter unit or runs
# along the alphabet (most neighbours the same step apart). The bounds leave every random key
# of 32 bytes or more as the example makes it, and 32 random hex digits, well clear of them.
MIN_SECRET_DISTINCT_CHARS = 8
MAX_SECRET_STEP_SHARE = 0.5
_MAKE_ONE = (
    "for example: python -c 'import base64, secrets; "
    'print("whsec_" + base64.b64encode(secrets.token_bytes(32)).decode())\''
)


def secret_problem(secret: str, *, what: str) -> str | None:
    """Why ``secret`` may not sign outbound calls (None: it may): the one rule for every
    signing secret (topic rows, settings topics, the webhook gateway, each outbound call)."""
    if secret.startswith(SECRET_PREFIX):
        return _key_problem(secret, what=what)
    size = len(secret.encode())
    if size < MIN_SECRET_BYTES:
        state = "is empty" if not size else f"has {size} bytes"
        need = f"a signing secret needs at least {MIN_SECRET_BYTES} bytes"
        return f"{what} {state}: {need} ({_MAKE_ONE})"
    weakness = _secret_weakness(secret)
    if weakness:
        return f"{what} is guessable: {weakness}; use a random one ({_MAKE_ONE})"
    return None


def _key_problem(secret: str, *, what: str) -> str | None:
    try:
        key = signing_key(secret)
    except ValueError:
        return f"{what} is not valid base64 after {SECRET_PREFIX} ({_MAKE_ONE})"
    if len(key) < MIN_KEY_BYTES:
        need = f"a {SECRET_PREFIX} key needs at least {MIN_KEY_BYTES} bytes"
        return f"{what} has a key of {len(key)} bytes: {need} ({_MAKE_ONE})"
    weakness = _secret_weakness(key.decode("latin-1"))  # one character per byte
    if weakness:
        return f"{what} is guessable: its key has {weakness}; use a random one ({_MAKE_ONE})"
    return None


def signing_key(secret: str) -> bytes:
    """The HMAC key of ``secret``: the bytes of a ``whsec_<base64>`` secret, the UTF-8 bytes of
    any other (``ValueError``: not base64 after the prefix)."""
    if not secret.startswith(SECRET_PREFIX):
        return secret.encode()
    text = secret.removeprefix(SECRET_PREFIX)
    try:  # padded or not, as the libraries take it
        return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except binascii.Error as exc:
        raise ValueError(f"not base64 after {SECRET_PREFIX}") from exc


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


def signature(secret: str, message_id: str, timestamp: int, body: bytes) -> str:
    """``v1,<base64>``: the Standard Webhooks signature of one call with one secret."""
    signed = f"{message_id}.{timestamp}.".encode() + body
    mac = hmac.new(signing_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def legacy_sign(secret: str, timestamp: int, body: bytes) -> str:
    """``sha256=<hex>`` over ``"<timestamp>." + body`` with the secret's text as the key, as
    receivers written before Standard Webhooks check it."""
    signed = str(timestamp).encode() + b"." + body
    return "sha256=" + hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()


def signed_headers(
    body: bytes,
    *,
    secrets: Sequence[str],
    message_id: str,
    timestamp: int,
    legacy: bool = False,
) -> dict[str, str]:
    """The headers that sign ``body``: one ``v1`` signature per secret (the current one first,
    then one being rotated out), and with ``legacy`` our older pair, signed with the current
    secret alone (its header holds one signature)."""
    headers = {
        ID_HEADER: message_id,
        TIMESTAMP_HEADER: str(timestamp),
        SIGNATURE_HEADER: " ".join(signature(s, message_id, timestamp, body) for s in secrets),
    }
    if legacy:
        headers[LEGACY_SIGNATURE_HEADER] = legacy_sign(secrets[0], timestamp, body)
        headers[LEGACY_TIMESTAMP_HEADER] = str(timestamp)
    return headers


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


def _open_socket(address: tuple[str, int], timeout: float, source_address=None) -> socket.socket:
    """``socket.create_connection`` for ``OutboundPool``'s connections: to the checked addresses
    only (``_checked_addresses``) unless ``WEBHOOK_ALLOW_PRIVATE``."""
    if settings.WEBHOOK_ALLOW_PRIVATE:
        return socket.create_connection(address, timeout, source_address)
    return _connect(_checked_addresses(*address), timeout, source_address, ())


class OutboundPool:
    """Keep-alive connections for signed POSTs (``post_signed``), on the standard library's
    ``http.client``: the sender's cost per call is what matters against a fast receiver, and a
    call through requests (or urllib3 under it) costs several times the bare client's CPU.
    What the pool keeps of their work: connections to the checked addresses only
    (``_open_socket``), TLS verified against certifi's CA bundle with the host name checked, a
    connection the receiver closed while idle dropped before reuse, up to ``pool_size`` idle
    connections per origin. No proxies, no retries (a failed call is retried by its job, with
    backoff), no redirects followed (a 3xx is the answer). Thread-safe: one pool serves a
    topic's callers."""

    def __init__(self, *, pool_size: int = 10) -> None:
        self.pool_size = pool_size
        self._idle: dict[tuple[str, str, int], list[http.client.HTTPConnection]] = {}
        self._lock = threading.Lock()
        self._tls: ssl.SSLContext | None = None

    def post(self, url: str, body: bytes, *, headers: dict[str, str], timeout_s: float) -> int:
        """The answer's status (its body read and dropped, so the connection is reused)."""
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        key = (scheme, parts.hostname or "", parts.port or (443 if scheme == "https" else 80))
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        conn = self._take(key, timeout_s)
        try:
            conn.request("POST", target, body=body, headers={"User-Agent": USER_AGENT, **headers})
            response = conn.getresponse()
            response.read()
        except BaseException:
            conn.close()
            raise
        if response.will_close:
            conn.close()
        else:
            with self._lock:
                idle = self._idle.setdefault(key, [])
                if len(idle) < self.pool_size:
                    idle.append(conn)
                    conn = None
            if conn is not None:
                conn.close()
        return response.status

    def _take(self, key: tuple[str, str, int], timeout_s: float) -> http.client.HTTPConnection:
        """An idle connection to ``key``'s origin still open, or a new one (not connected yet)."""
        while True:
            with self._lock:
                idle = self._idle.get(key)
                conn = idle.pop() if idle else None
            if conn is None:
                break
            if conn.sock is not None and not wait_for_read(conn.sock, timeout=0):
                conn.timeout = timeout_s
                conn.sock.settimeout(timeout_s)
                return conn
            conn.close()  # closed by the receiver (or it sent what nobody asked for)
        scheme, host, port = key
        if scheme == "https":
            if self._tls is None:
                self._tls = ssl.create_default_context(cafile=certifi.where())
            conn = http.client.HTTPSConnection(host, port, timeout=timeout_s, context=self._tls)
        else:
            conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
        conn._create_connection = _open_socket  # as http.client's own tests replace it
        return conn

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                conn.close()

    def __enter__(self) -> OutboundPool:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


USER_AGENT = "couponcenter-webhooks"


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


def _failure_kind(exc: BaseException) -> str:
    """What went wrong, in words that hold whatever the client (the error's own class in
    brackets): ``Timeout``, ``ConnectionError`` (no connection, or it broke), ``ProtocolError``
    (the answer was not HTTP), ``NameResolutionError``."""
    if isinstance(exc, TimeoutError):
        kind = "Timeout"
    elif isinstance(exc, socket.gaierror | UnicodeError):
        kind = "NameResolutionError"
    elif isinstance(exc, OSError | http.client.RemoteDisconnected):
        kind = "ConnectionError"
    else:
        kind = "ProtocolError"
    return f"{kind} ({exc.__class__.__name__})"


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
    secrets: Sequence[str],
    idempotency_key: str,
    pool: OutboundPool | None = None,
    what: str = "target",
    timeout_s: float | None = None,
    allow_http: bool = False,
    legacy_signature: bool = False,
) -> int:
    """POST ``body`` signed with each of ``secrets`` (the current one first; more than one
    while a secret is rotated), ``idempotency_key`` as its ``webhook-id`` (``pool``: an
    ``OutboundPool`` to reuse its connections).

    Raises ``ValueError`` (refused target or secret) or ``OutboundCallFailed`` (the call failed,
    a non-public address was refused, or the receiver answered a redirect or an error status).
    """
    check_target(url, what=what, allow_http=allow_http)
    if not secrets:
        raise ValueError(f"no secret to sign the calls to {origin(url)}")
    for secret in secrets:
        problem = secret_problem(secret, what=f"the secret of {origin(url)}")
        if problem:
            raise ValueError(problem)
    headers = signed_headers(
        body,
        secrets=secrets,
        message_id=idempotency_key,
        timestamp=int(time.time()),
        legacy=legacy_signature,
    )
    own = pool is None
    pool = pool or OutboundPool(pool_size=1)
    try:
        status = pool.post(
            url,
            body,
            timeout_s=settings.WEBHOOK_TIMEOUT_S if timeout_s is None else timeout_s,
            headers={
                "Content-Type": "application/json",
                "Idempotency-Key": idempotency_key,
                **headers,
            },
        )
    except (http.client.HTTPException, OSError, UnicodeError) as exc:
        refused = _refused_private(exc)
        if refused:
            raise OutboundCallFailed(
                f"{what} {origin(url)} refused: {refused} (set WEBHOOK_ALLOW_PRIVATE=1)"
            ) from None
        raise OutboundCallFailed(f"{_failure_kind(exc)} calling {origin(url)}") from None
    finally:
        if own:
            pool.close()
    if status >= 300:
        kind = "redirect (not followed)" if status < 400 else "error"
        raise OutboundCallFailed(f"HTTP {status} {kind} from {origin(url)}")
    return status
