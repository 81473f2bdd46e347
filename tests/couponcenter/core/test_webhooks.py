"""The one signed-POST helper every outbound call goes through (the reminders' webhook gateway,
``http`` timeout topics): redirects are failures and never followed, the plain-HTTP guard reads
the scheme whatever its case, and a failure names only the scheme and host of the target (its
path and query often carry a secret). A real HTTP receiver on 127.0.0.1 checks what arrives."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from couponcenter.core.webhooks import post_signed

SECRET = "s" * 32


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
        post_signed(f"{target.origin}/hook", b"{}", secret=SECRET, idempotency_key="k1")
    assert len(target.requests) == 1
    assert elsewhere.requests == []  # neither the body nor the signature went anywhere else


@pytest.mark.parametrize("url", ["HTTP://127.0.0.1:9/x", "Http://127.0.0.1:9/x"])
def test_plain_http_is_refused_whatever_the_case_of_the_scheme(settings, url):
    settings.WEBHOOK_ALLOW_HTTP = False
    with pytest.raises(ValueError, match="plain-HTTP target refused"):
        post_signed(url, b"{}", secret=SECRET, idempotency_key="k1")


def test_a_failure_names_the_scheme_and_host_only(servers):
    target = Server(500)
    servers.append(target)
    url = f"{target.origin}/fail/TOKENINPATH?api_key=SECRETINQUERY"
    with pytest.raises(requests.RequestException) as caught:
        post_signed(url, b"{}", secret=SECRET, idempotency_key="k1")
    text = f"{caught.value} {caught.value!r}"
    assert "500" in text and target.origin in text
    assert "TOKENINPATH" not in text and "SECRETINQUERY" not in text


def test_an_unreachable_target_names_the_scheme_and_host_only(servers):
    target = Server()
    servers.append(target)
    target.httpd.shutdown()
    target.httpd.server_close()  # nothing listens there any more
    with pytest.raises(requests.RequestException) as caught:
        post_signed(f"{target.origin}/x?api_key=SECRETINQUERY", b"{}", secret=SECRET,
                    idempotency_key="k1")  # fmt: skip
    text = f"{caught.value} {caught.value!r}"
    assert target.origin in text and "SECRETINQUERY" not in text
