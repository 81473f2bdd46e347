"""The reminder worker's start-up warms Celery (``_warm_celery``): its first publish, in the middle
of the first burst, imports nothing. Checked in a fresh interpreter (the test process has imported
everything long ago), publishing to the real broker on a queue of its own."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

from django.conf import settings

PROBE = """
import json, os, sys
import django
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "couponcenter.settings")
django.setup()
from celery import current_app
from reminders.runtime.worker import _warm_celery

queue = sys.argv[1]
if sys.argv[2] == "warm":
    _warm_celery()
before = set(sys.modules)
current_app.send_task("reminders.deliver_reminders", args=[{}], queue=queue)
imported = sorted(set(sys.modules) - before)
with current_app.connection_for_write() as conn:
    client = conn.default_channel.client
    published = client.llen(queue)
    for key in list(client.scan_iter(match=f"*{queue}*")):  # the queue and kombu's binding
        client.delete(key)
print(json.dumps({"imported": imported, "published": published}))
"""


def probe(mode: str) -> dict:
    queue = f"warmup-probe-{uuid.uuid4().hex[:8]}"
    out = subprocess.run(
        [sys.executable, "-c", PROBE, queue, mode],
        capture_output=True, text=True, check=True, cwd=settings.BASE_DIR, timeout=120,
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_after_the_warm_up_the_first_publish_imports_nothing():
    cold, warm = probe("cold"), probe("warm")
    assert cold["published"] == warm["published"] == 1
    assert "celery.events" in cold["imported"]  # what the warm-up is for
    assert warm["imported"] == []
