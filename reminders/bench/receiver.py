"""A local keep-alive HTTP receiver for ``bench_timeouts``, run as its own process:
``python -m reminders.bench.receiver PORT``.

``POST /<path>`` answers 204 at once, or after ``?delay=S`` seconds; each request's arrival time
and the ``action_time`` in its JSON body (when there is one) are kept per path. ``GET /stats``
returns, per path, the count, the first and last arrival (epoch seconds) and, with
``?lateness=<path>``, every lateness sample of that path in ms. ``POST /reset`` forgets all.
HTTP/1.1 with keep-alive, one thread per connection: the same receiver serves the plain client
of the raw limit and the executors, so the two figures share its ceiling.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections import defaultdict
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

_lock = threading.Lock()
_seen: dict[str, list[float]] = defaultdict(list)  # path -> arrival times
_late: dict[str, list[float]] = defaultdict(list)  # path -> lateness ms


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:  # noqa: N802 (the http.server API)
        arrived = time.time()
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        url = urlsplit(self.path)
        if url.path == "/reset":
            with _lock:
                _seen.clear()
                _late.clear()
            return self._answer(204)
        delay = float(parse_qs(url.query).get("delay", ["0"])[0])
        late = None
        if body[:1] == b"{":
            action = json.loads(body).get("action_time")
            if action:
                late = (arrived - datetime.fromisoformat(action).timestamp()) * 1000
        with _lock:
            _seen[url.path].append(arrived)
            if late is not None:
                _late[url.path].append(late)
        if delay:
            time.sleep(delay)
        self._answer(204)

    def do_GET(self) -> None:  # noqa: N802
        url = urlsplit(self.path)
        wanted = parse_qs(url.query).get("lateness", [None])[0]
        with _lock:
            stats = {
                path: {"count": len(times), "first": min(times), "last": max(times)}
                for path, times in _seen.items()
                if times
            }
            if wanted:
                stats["lateness_ms"] = list(_late.get(wanted, []))
        body = json.dumps(stats).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _answer(self, status: int) -> None:
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def main(port: int) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    server.request_queue_size = 1024
    print(f"receiver ready on {port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main(int(sys.argv[1]))
