"""The monitoring that ships with the service: the Grafana dashboard and the Prometheus alert rules
(``deploy/``) use only metrics ``/metrics`` really serves, the rules pass ``promtool``, and a real
Prometheus scrapes a running service and answers a reminder-lateness quantile."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import requests
import yaml
from django.conf import settings

from couponcenter.coupons.bench.http import free_port
from reminders import metrics
from reminders.members import REMINDER_TOPIC

DEPLOY = Path(settings.BASE_DIR) / "deploy"
DASHBOARD = DEPLOY / "grafana" / "couponcenter.json"
RULES = DEPLOY / "prometheus" / "alerts.yml"
METRIC = re.compile(r"\bcouponcenter_[a-z0-9_]+")
TOKEN = "monitoring-test-token-0123456789abcdef"


def _dashboard_exprs() -> list[str]:
    board = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for panel in board["panels"] for t in panel.get("targets", [])]
    exprs += [v["query"] for v in board["templating"]["list"] if v.get("type") == "query"]
    return exprs


def _rule_exprs() -> list[str]:
    rules = yaml.safe_load(RULES.read_text())
    return [rule["expr"] for group in rules["groups"] for rule in group["rules"]]


def _family(name: str) -> str:
    return re.sub(r"_(bucket|sum|count|total)$", "", name)


def _served(client) -> str:
    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200, response.content[:300]
    return response.content.decode()


@pytest.fixture
def token(settings):
    settings.METRICS_TOKEN = TOKEN


@pytest.mark.django_db
def test_every_metric_the_dashboard_and_rules_use_is_served(client, token, reminder_settings):
    metrics.record(REMINDER_TOPIC, {"dispatched": 3, "delivered": 2, "failed": 1, "capped": 1,
                                    "digested": 1}, [40, 900])  # fmt: skip
    served = _served(client)
    families = {_family(m) for m in METRIC.findall(served)}
    used = {m for expr in _dashboard_exprs() + _rule_exprs() for m in METRIC.findall(expr)}
    assert len(used) >= 10, used
    missing = sorted(m for m in used if _family(m) not in families)
    assert not missing, f"used by deploy/ but not on /metrics: {missing}"
    # The label values the expressions select on exist too.
    for event in ("failed", "delivered", "capped", "digested"):
        assert f'event="{event}"' in served, event


def test_the_dashboard_is_grafana_json_with_targets():
    board = json.loads(DASHBOARD.read_text())
    assert board["uid"] == "couponcenter" and board["panels"]
    for panel in board["panels"]:
        assert panel["targets"] and all(t["expr"].strip() for t in panel["targets"]), panel


def test_the_alert_rules_pass_promtool():
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is missing: apt-get install prometheus (.ci/run installs it)")
    done = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(_rule_exprs())} rules found" in done.stdout


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_real_prometheus_scrapes_the_service_and_answers_a_lateness_quantile(
    live_server, token, tmp_path, reminder_settings
):
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("prometheus is missing: apt-get install prometheus (.ci/run installs it)")
    # A topic label of its own: the histogram is the process's, and earlier tests in this
    # process recorded their own lateness under the reminder topic.
    topic = f"{REMINDER_TOPIC}.prom-{uuid.uuid4().hex[:8]}"
    metrics.record(topic, {"delivered": 100}, [30] * 90 + [700] * 10)
    target = urlsplit(live_server.url).netloc
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [{
            "job_name": "couponcenter", "metrics_path": "/metrics",
            "authorization": {"type": "Bearer", "credentials": TOKEN},
            "static_configs": [{"targets": [target]}],
        }],
    }))  # fmt: skip
    port = free_port()
    log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    bucket = f'couponcenter_delivery_lateness_seconds_bucket{{topic="{topic}"}}'
    query = f"histogram_quantile(0.99, sum by (le) ({bucket}))"
    try:
        deadline, value = time.monotonic() + 90, None
        while time.monotonic() < deadline and value is None:
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()[-3000:]
            try:
                answer = requests.get(f"http://127.0.0.1:{port}/api/v1/query",
                                      params={"query": query}, timeout=5).json()  # fmt: skip
            except requests.RequestException:
                answer = {}
            result = answer.get("data", {}).get("result", [])
            if result:
                value = float(result[0]["value"][1])
            else:
                time.sleep(0.5)  # polling an outside process's scrape, not a stand-in for a sync
        assert value is not None, (tmp_path / "prometheus.log").read_text()[-3000:]
        # 10 % of the samples were 0.7 s late, in the 0.5-1 s bucket: p99 lies inside it.
        assert 0.5 <= value <= 1.0, value
        rules = requests.get(f"http://127.0.0.1:{port}/api/v1/rules", timeout=5).json()
        loaded = [r["name"] for g in rules["data"]["groups"] for r in g["rules"]]
        assert "CouponCenterLatenessP99" in loaded
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
