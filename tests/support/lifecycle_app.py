"""The real WSGI app, plus ``GET /__slow__?s=N`` holding its worker N seconds (lifecycle tests)."""

import time
from urllib.parse import parse_qs

from couponcenter.wsgi import application as django_application


def application(environ, start_response):
    if environ.get("PATH_INFO") == "/__slow__":
        seconds = float(parse_qs(environ.get("QUERY_STRING", "")).get("s", ["1"])[0])
        time.sleep(seconds)
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"slept\n"]
    return django_application(environ, start_response)
