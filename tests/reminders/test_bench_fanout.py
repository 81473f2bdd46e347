"""The fan-out benchmark, tiny, against what it runs for real: nginx answering 204, wrk, one
``run_reminder_worker`` firing an http topic and (where node is) a BullMQ worker. Its figures
are arrivals in nginx's access log: each job once, each signed with the topic's secret."""

from __future__ import annotations

import base64
import json
import os
import uuid
from io import StringIO

import pytest
import requests
from django.core.management import call_command

from couponcenter.core.redis import get_redis
from couponcenter.core.webhooks import SECRET_PREFIX, signature
from reminders.bench import fanout
from reminders.bench.nginx import Nginx, nginx_receiver
from reminders.bench.peers import BULLMQ_VERSION, npm_package
from reminders.bench.tables import delete_keys
from reminders.handlers.timeout_jobs import job_payload
from reminders.models import TimeoutJob, TimeoutTopic

pytestmark = [
    pytest.mark.postgres,
    # Alone: nginx, wrk and the worker firing against a deadline, with the machine to themselves.
    pytest.mark.alone,
    pytest.mark.django_db(transaction=True),
    # Under CI=1 a skip fails the run (tests/conftest.py): .ci/run installs both.
    pytest.mark.skipif(bool(fanout.missing_tools()), reason="nginx or wrk is not installed"),
]

SECRET = SECRET_PREFIX + base64.b64encode(os.urandom(32)).decode()


def _noop(what: str, done: int, total: int) -> None:
    pass


@pytest.fixture
def prefix(settings):
    prefix = f"cctest-fanout-{uuid.uuid4().hex[:8]}"
    settings.REDIS_KEY_PREFIX = prefix
    yield prefix
    fanout._cleanup_rows((fanout.TOPIC,))
    delete_keys(prefix)


def test_our_figures_are_every_job_arriving_once_signed_with_the_topic_secret(prefix):
    with nginx_receiver() as nginx:
        raw = fanout.bench_wrk(nginx, seconds=1, connections=2, secret=SECRET)
        ours = fanout.bench_ours(
            nginx, count=300, concurrency=4, secret=SECRET, prefix=prefix, progress=_noop
        )
        logged_by_wrk = nginx.count("/wrk")
        arrivals = nginx.arrivals("/ours")
    # wrk counts the answers it read; nginx logs every request, those cut off at the end too.
    assert 0 < raw["wrk_requests"] <= logged_by_wrk <= raw["wrk_requests"] + 2
    jobs = {
        f"{fanout.TOPIC}:{job.pk}": job for job in TimeoutJob.objects.filter(topic=fanout.TOPIC)
    }
    assert len(jobs) == 300
    assert all(job.status == TimeoutJob.Status.PROCESSED for job in jobs.values())
    assert len(arrivals) == ours["ours_arrived"] == 300 and ours["ours_repeated"] == 0
    assert sorted(a.webhook_id for a in arrivals) == sorted(jobs)
    for arrival in arrivals:
        body = json.dumps(job_payload(jobs[arrival.webhook_id]), sort_keys=True).encode()
        signed = signature(SECRET, arrival.webhook_id, int(arrival.webhook_timestamp), body)
        assert arrival.webhook_signature == signed and arrival.status == 204
    assert ours["ours_per_s"] == round(300 / (arrivals[-1].at - arrivals[0].at))
    assert ours["ours_cpu_s_per_1k"] > 0


def test_the_command_reports_ours_beside_wrk_and_leaves_nothing_behind(settings):
    settings.DEBUG = True  # the command refuses to load and delete data otherwise
    before = settings.REDIS_KEY_PREFIX, settings.DELIVERY_QUEUE
    out, err = StringIO(), StringIO()
    call_command(
        "bench_fanout", "--count", "200", "--concurrency", "2", "--wrk-seconds", "1",
        "--no-bullmq", "--json", stdout=out, stderr=err,
    )  # fmt: skip
    result = json.loads(out.getvalue())
    assert result["ours_arrived"] == result["ours_verified"] == 200
    assert result["fanout_of_wrk"] == round(result["ours_per_s"] / result["wrk_per_s"], 3)
    assert result["fanout_cpu_s_per_1k"] == result["ours_cpu_s_per_1k"] > 0
    assert result["fanout_of_bullmq"] is None and "bullmq_per_s" not in result
    assert "target >= 0.2" in err.getvalue()  # the verdicts are printed beside the figures
    assert not TimeoutJob.objects.filter(topic=fanout.TOPIC).exists()
    assert not TimeoutTopic.objects.filter(name=fanout.TOPIC).exists()
    # The run's keys were its own namespace's, gone with it; this process's settings are back.
    assert before == (settings.REDIS_KEY_PREFIX, settings.DELIVERY_QUEUE)
    assert not list(get_redis().scan_iter(match="ccbench-*", count=1000))


def test_the_bullmq_worker_posts_every_webhook_once_signed():
    folder, why = npm_package("bullmq", BULLMQ_VERSION)
    if folder is None:
        pytest.skip(why)
    with nginx_receiver() as nginx:
        result = fanout.bench_bullmq(nginx, count=200, concurrency=4, secret=SECRET, progress=_noop)
        arrivals = nginx.arrivals("/bullmq")
    assert result["bullmq_arrived"] == len(arrivals) == 200 and result["bullmq_failed"] == 0
    assert sorted(a.webhook_id for a in arrivals) == sorted(
        f"{fanout.TOPIC}:{n}" for n in range(1, 201)
    )
    assert all(a.webhook_signature.startswith("v1,") and a.status == 204 for a in arrivals)
    assert result["bullmq_cpu_s_per_1k"] > 0


def test_the_access_log_is_counted_as_it_grows_and_a_half_written_line_waits(tmp_path):
    """``Nginx.count`` reads only what is new on each call; a line nginx is still writing is
    counted once it is whole, not lost and not counted twice. The log is a real file here,
    written as nginx writes it (whole lines appended), with its last line cut in two."""
    log = tmp_path / "access.log"
    log.write_bytes(b"1.000\t/a\t204\ta:1\t1\tv1,x\n1.001\t/b\t204\tb:1\t1\tv1,x\n")
    receiver = Nginx(url="http://127.0.0.1:1", directory=tmp_path, process=None)
    assert (receiver.count("/a"), receiver.count("/b")) == (1, 1)
    with log.open("ab") as out:
        out.write(b"1.002\t/a\t204\ta:2\t1\tv1,x\n1.003\t/a\t2")
    assert receiver.count("/a") == 2
    with log.open("ab") as out:
        out.write(b"04\ta:3\t1\tv1,x\n")
    assert receiver.count("/a") == 3 and receiver.count("/b") == 1
    assert [a.webhook_id for a in receiver.arrivals("/a")] == ["a:1", "a:2", "a:3"]


def test_nginx_logs_each_request_and_count_follows_it():
    with nginx_receiver() as nginx, requests.Session() as session:
        assert nginx.count("/a") == 0
        for path in ("/a", "/a", "/b"):
            assert session.post(nginx.url + path, data=b"{}", timeout=10).status_code == 204
        assert nginx.wait_logged("/a", 2) == 2
        assert nginx.count("/b") == 1
        session.post(nginx.url + "/a", data=b"{}", timeout=10)
        assert nginx.wait_logged("/a", 3) == 3
