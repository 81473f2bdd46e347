"""A real HTTP receiver on 127.0.0.1 for the tests of outbound calls (timeout topics)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Webhook:
    """Records each request and answers with ``status``."""

    def __init__(self) -> None:
        self.status = 200
        self.requests: list[tuple[dict[str, str], bytes]] = []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                hook.requests.append((dict(self.headers), body))
                self.send_response(hook.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"

    @property
    def keys(self) -> list[str]:
        """The ``Idempotency-Key`` of each request, in order."""
        return [headers["Idempotency-Key"] for headers, _ in self.requests]


@contextmanager
def serving_webhook() -> Iterator[Webhook]:
    hook = Webhook()
    thread = threading.Thread(target=hook.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hook
    finally:
        hook.server.shutdown()
        hook.server.server_close()
