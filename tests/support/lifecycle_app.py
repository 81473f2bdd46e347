"""The real WSGI app, plus ``GET /__slow__?s=N[&mark=PATH]`` holding its worker N seconds
(lifecycle tests). With ``mark``, the request writes the time it started to PATH first, so a test
knows the request is in a worker without guessing how long that takes. ``GET /__gc__`` answers the
serving worker's collector settings (its thresholds and how many objects are frozen), as JSON."""

import gc
import json
import time
from pathlib import Path
from urllib.parse import parse_qs

from couponcenter.wsgi import application as django_application


def application(environ, start_response):
    if environ.get("PATH_INFO") == "/__slow__":
        query = parse_qs(environ.get("QUERY_STRING", ""))
        seconds = float(query.get("s", ["1"])[0])
        if "mark" in query:
            Path(query["mark"][0]).write_text(repr(time.time()))
        time.sleep(seconds)
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"slept\n"]
    if environ.get("PATH_INFO") == "/__gc__":
        start_response("200 OK", [("Content-Type", "application/json")])
        got = {"threshold": gc.get_threshold(), "frozen": gc.get_freeze_count()}
        return [json.dumps(got).encode()]
    return django_application(environ, start_response)
