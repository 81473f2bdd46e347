"""The one signed-POST helper every outbound call goes through (the reminders' webhook gateway,
``http`` timeout topics): redirects are failures and never followed, the plain-HTTP guard reads
the scheme whatever its case, and a failure names only the scheme and host of the target (its
path and query often carry a secret). A real HTTP receiver on 127.0.0.1 checks what arrives."""

from __future__ import annotations

import base64
import os
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from couponcenter.core.webhooks import (
    OutboundPool,
    address_refused,
    legacy_sign,
    post_signed,
    secret_problem,
    signature,
    signed_headers,
    signing_key,
)

SECRET = "webhook-test-secret-of-thirty-two-bytes"


class Server:
    """Answers ``status`` (with ``Location: redirect_to`` on a 3xx) and records every POST."""

    def __init__(self, status: int = 204, redirect_to: str = "") -> None:
        self.requests: list[tuple[str, dict[str, str], bytes]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                server.requests.append((self.path, dict(self.headers), body))
                self.send_response(status)
                if redirect_to:
                    self.send_header("Location", redirect_to)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.origin = f"http://127.0.0.1:{self.httpd.server_port}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


@pytest.fixture
def servers() -> Iterator[list[Server]]:
    made: list[Server] = []
    yield made
    for server in made:
        server.httpd.shutdown()


@pytest.fixture(autouse=True)
def local_http(settings):
    settings.WEBHOOK_ALLOW_HTTP = True  # the receivers here are plain HTTP on loopback


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_is_a_failure_and_is_never_followed(servers, status):
    elsewhere = Server()
    servers.append(elsewhere)
    target = Server(status, redirect_to=f"{elsewhere.origin}/steal")
    servers.append(target)
    with pytest.raises(requests.RequestException, match=str(status)):
        post_signed(f"{target.origin}/hook", b"{}", secrets=[SECRET], idempotency_key="k1")
    assert len(target.requests) == 1
    assert elsewhere.requests == []  # neither the body nor the signature went anywhere else


@pytest.mark.parametrize("url", ["HTTP://127.0.0.1:9/x", "Http://127.0.0.1:9/x"])
def test_plain_http_is_refused_whatever_the_case_of_the_scheme(settings, url):
    settings.WEBHOOK_ALLOW_HTTP = False
    with pytest.raises(ValueError, match="plain-HTTP target refused"):
        post_signed(url, b"{}", secrets=[SECRET], idempotency_key="k1")


def test_a_failure_names_the_scheme_and_host_only(servers):
    target = Server(500)
    servers.append(target)
    url = f"{target.origin}/fail/TOKENINPATH?api_key=SECRETINQUERY"
    with pytest.raises(requests.RequestException) as caught:
        post_signed(url, b"{}", secrets=[SECRET], idempotency_key="k1")
    text = f"{caught.value} {caught.value!r}"
    assert "500" in text and target.origin in text
    assert "TOKENINPATH" not in text and "SECRETINQUERY" not in text


def test_an_unreachable_target_names_the_scheme_and_host_only(servers):
    target = Server()
    servers.append(target)
    target.httpd.shutdown()
    target.httpd.server_close()  # nothing listens there any more
    with pytest.raises(requests.RequestException) as caught:
        post_signed(f"{target.origin}/x?api_key=SECRETINQUERY", b"{}", secrets=[SECRET],
                    idempotency_key="k1")  # fmt: skip
    text = f"{caught.value} {caught.value!r}"
    assert target.origin in text and "SECRETINQUERY" not in text


@pytest.mark.parametrize("secret", ["", "s" * 31])
def test_a_short_secret_signs_nothing(secret):
    # Refused before any connection is made: the target need not exist.
    with pytest.raises(ValueError, match="at least 32 bytes"):
        post_signed("https://hooks.example.invalid/x", b"{}", secrets=[secret], idempotency_key="k")


# Long enough, but each one guessed in far fewer tries than 32 random bytes would take.
GUESSABLE = {
    "one character": "x" * 40,
    "few characters": "abcd" * 10,
    "a repeated unit": "q8Zr2mXw" * 5 + "q8",
    "a run": "abcdefghijklmnopqrstuvwxyzABCDEF",
    "a repeated run": "0123456789abcdef" * 2,
}


@pytest.mark.parametrize("secret", GUESSABLE.values(), ids=GUESSABLE.keys())
def test_a_long_but_guessable_secret_signs_nothing(secret):
    problem = secret_problem(secret, what="the secret")
    assert problem is not None and problem.startswith("the secret is guessable")
    with pytest.raises(ValueError, match="guessable"):
        post_signed("https://hooks.example.invalid/x", b"{}", secrets=[secret], idempotency_key="k")


@pytest.mark.parametrize(
    "secret",
    [
        "9c1d92454df7a6654660befabadb36fd",  # secrets.token_hex(16)
        "cYNxB7-FCVlfiaLhE7ga5weS3Scq4B-d3xAY1Tlml8Q",  # secrets.token_urlsafe(32)
        "a-signing-phrase-of-at-least-thirty-two-bytes",
    ],
)
def test_a_random_or_long_phrase_secret_is_sound(secret):
    assert secret_problem(secret, what="the secret") is None


def _whsec(key: bytes) -> str:
    return "whsec_" + base64.b64encode(key).decode()


WHSEC_REFUSED = {
    "not base64": ("whsec_not base64!", "not valid base64"),
    "a short key": (_whsec(os.urandom(16)), "at least 24 bytes"),
    "a repeated key": (_whsec(b"0123456789ab" * 3), "guessable"),
    "no key": ("whsec_", "at least 24 bytes"),
}


@pytest.mark.parametrize(("secret", "why"), WHSEC_REFUSED.values(), ids=WHSEC_REFUSED.keys())
def test_a_whsec_secret_is_judged_by_its_decoded_key(secret, why):
    problem = secret_problem(secret, what="the secret")
    assert problem is not None and why in problem
    with pytest.raises(ValueError, match=why):
        post_signed("https://hooks.example.invalid/x", b"{}", secrets=[secret], idempotency_key="k")


def test_a_random_whsec_key_of_24_bytes_or_more_is_sound():
    # 24 bytes: the keys other senders of Standard Webhooks hand out.
    assert secret_problem(_whsec(os.urandom(24)), what="the secret") is None
    assert secret_problem(_whsec(os.urandom(32)), what="the secret") is None


def test_a_text_secret_and_its_whsec_form_are_one_key():
    text = "a-signing-phrase-of-at-least-thirty-two-bytes"
    assert signing_key(text) == text.encode() == signing_key(_whsec(text.encode()))
    assert signature(text, "id", 1, b"{}") == signature(_whsec(text.encode()), "id", 1, b"{}")


def test_every_secret_signs_and_the_legacy_pair_comes_only_when_asked():
    new, old = _whsec(os.urandom(32)), _whsec(os.urandom(32))
    plain = signed_headers(b"{}", secrets=[new, old], message_id="t:1", timestamp=1_800_000_000)
    assert plain["webhook-signature"].split(" ") == [
        signature(new, "t:1", 1_800_000_000, b"{}"),
        signature(old, "t:1", 1_800_000_000, b"{}"),
    ]
    assert set(plain) == {"webhook-id", "webhook-timestamp", "webhook-signature"}
    legacy = signed_headers(
        b"{}", secrets=[new, old], message_id="t:1", timestamp=1_800_000_000, legacy=True
    )
    assert legacy["X-Coupon-Center-Timestamp"] == "1800000000"
    assert legacy["X-Coupon-Center-Signature"] == legacy_sign(new, 1_800_000_000, b"{}")


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_a_private_address_is_refused_before_anything_is_sent(servers, settings, host):
    """Loopback here; the check is on the address connected to, so a public-looking name that
    resolves to it ("localhost" stands in for one) is refused as well."""
    settings.WEBHOOK_ALLOW_PRIVATE = False
    target = Server()
    servers.append(target)
    url = f"http://{host}:{target.httpd.server_port}/hook?api_key=SECRETINQUERY"
    with pytest.raises(requests.RequestException, match="not a public address") as caught:
        post_signed(url, b"{}", secrets=[SECRET], idempotency_key="k1")
    assert "WEBHOOK_ALLOW_PRIVATE" in str(caught.value) and "SECRETINQUERY" not in str(caught.value)
    assert target.requests == []  # not a byte of the body or the signature went out


def test_private_addresses_are_allowed_when_configured(servers, settings):
    settings.WEBHOOK_ALLOW_PRIVATE = True
    target = Server()
    servers.append(target)
    post_signed(f"{target.origin}/hook", b"{}", secrets=[SECRET], idempotency_key="k1")
    assert len(target.requests) == 1


@pytest.mark.parametrize(
    ("address", "refused"),
    [("10.1.2.3", True), ("172.16.0.1", True), ("192.168.1.1", True), ("169.254.169.254", True),
     ("::1", True), ("fe80::1", True), ("fd00::1", True), ("::ffff:10.0.0.1", True),
     ("0.0.0.0", True), ("224.0.0.1", True), ("8.8.8.8", False), ("2606:4700::1111", False)],
)  # fmt: skip
def test_which_addresses_are_non_public(address, refused):
    assert address_refused(address) is refused


def test_an_open_and_a_closed_private_port_are_refused_alike_and_never_connected(settings):
    """No port scan through ``last_error``: the address is checked before any connection is
    made, so a listening port and a closed one give the same error, and the listening one never
    sees a connection (its backlog stays empty: nothing to accept)."""
    settings.WEBHOOK_ALLOW_PRIVATE = False
    listening = socket.socket()
    closed = socket.socket()  # bound, not listening: a connection to it is refused
    try:
        listening.bind(("127.0.0.1", 0))
        listening.listen(8)
        closed.bind(("127.0.0.1", 0))
        errors = []
        for sock in (listening, closed):
            port = sock.getsockname()[1]
            with pytest.raises(requests.RequestException) as caught:
                post_signed(f"http://127.0.0.1:{port}/hook", b"{}", secrets=[SECRET],
                            idempotency_key="k1")  # fmt: skip
            errors.append(
                f"{type(caught.value).__name__}: {caught.value}".replace(f":{port}", ":PORT")
            )
        listening.setblocking(False)
        with pytest.raises(BlockingIOError):
            listening.accept()  # no connection was ever made to it
        assert errors[0] == errors[1]
        assert "refused" in errors[0] and "WEBHOOK_ALLOW_PRIVATE" in errors[0]
    finally:
        listening.close()
        closed.close()


class KeepAliveServer:
    """HTTP/1.1 with keep-alive, answering 204; records each call's client port. With
    ``close_after``, it closes the connection after answering without saying so (a receiver
    whose idle timeout ran out), and ``closed`` counts the connections it closed."""

    def __init__(self, *, close_after: bool = False) -> None:
        self.ports: list[int] = []
        self.closed = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                server.ports.append(self.client_address[1])
                self.send_response(204)
                self.end_headers()
                self.close_connection = close_after

            def log_message(self, *args) -> None:
                pass

        class Closing(ThreadingHTTPServer):
            def shutdown_request(self, request) -> None:
                super().shutdown_request(request)
                server.closed += 1

        self.httpd = Closing(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_port}/hook"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


def test_a_pool_reuses_one_connection_call_after_call(settings):
    settings.WEBHOOK_ALLOW_PRIVATE = True
    server = KeepAliveServer()
    try:
        with OutboundPool(pool_size=2) as pool:
            for n in range(5):
                post_signed(server.url, b"{}", secrets=[SECRET], idempotency_key=f"k{n}", pool=pool)
        assert len(server.ports) == 5 and len(set(server.ports)) == 1
    finally:
        server.httpd.shutdown()


def test_a_connection_the_receiver_closed_while_idle_is_not_reused(settings):
    settings.WEBHOOK_ALLOW_PRIVATE = True
    server = KeepAliveServer(close_after=True)
    try:
        with OutboundPool(pool_size=2) as pool:
            for n in range(3):
                post_signed(server.url, b"{}", secrets=[SECRET], idempotency_key=f"k{n}", pool=pool)
                deadline = time.monotonic() + 10
                while server.closed <= n and time.monotonic() < deadline:
                    time.sleep(0.01)  # until the receiver has closed it: the pool's check sees it
        assert len(server.ports) == 3 and len(set(server.ports)) == 3  # a new one each time
    finally:
        server.httpd.shutdown()


@pytest.fixture
def self_signed_https(tmp_path) -> Iterator[str]:
    """An HTTPS receiver on 127.0.0.1 whose certificate no CA signed."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
         "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key),
         "-out", str(cert)], check=True, capture_output=True,
    )  # fmt: skip
    target = Server()
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    target.httpd.socket = context.wrap_socket(target.httpd.socket, server_side=True)
    yield f"https://127.0.0.1:{target.httpd.server_port}/hook"
    target.httpd.shutdown()


def test_tls_is_verified_a_self_signed_receiver_gets_nothing(settings, self_signed_https):
    settings.WEBHOOK_ALLOW_PRIVATE = True
    with pytest.raises(requests.RequestException, match="SSLCertVerificationError"):
        post_signed(self_signed_https, b"{}", secrets=[SECRET], idempotency_key="k1")
