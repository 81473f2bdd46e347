"""The security matrix: each attack of the hardening review, tried against every surface that
takes it, with the refusal each must meet. Real requests, real servers; the per-surface details
live in the tests named in each row's comment.

| attack | surfaces |
| --- | --- |
| brute-force sign-in | admin login, token endpoint (test_admin_login, test_token_auth) |
| a receiver that redirects | webhook gateway, http timeout topic (test_webhooks) |
| a plain-HTTP target, any case | outbound calls, topic validation (test_webhooks) |
| a private or loopback target | outbound calls, an http topic firing (test_webhooks) |
| a guessable signing secret | outbound calls, topic rows, settings topics, check --deploy |
| a body that exhausts the parser | every URL in the schema (test_api_fuzz_all) |
| out-of-bounds live settings | the ops API, the admin (test_config_bounds) |
| staff without the permission | every staff endpoint (test_permission_matrix, test_accounts) |
| a callable outside the allow-list | topic API and admin, older rows (test_topic_permissions) |
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.contrib.auth import get_user_model
from django.core.exceptions import ImproperlyConfigured, ValidationError
from django.test import Client
from django.utils import timezone
from rest_framework.authtoken.models import Token

from couponcenter.core.webhooks import OutboundCallFailed, check_target, post_signed
from couponcenter.coupons import accounts
from couponcenter.coupons.models import Coupon
from reminders.engine import topic_model
from reminders.engine.clock import epoch_ms
from reminders.gateways import WebhookGateway
from reminders.models import ReminderSettings, TimeoutJob, TimeoutTopic
from reminders.runtime.worker import build_worker
from reminders.selectors.timeout_topics import settings_topic_specs
from reminders.services import timeout_job_create, timeout_topic_save
from tests.couponcenter.conftest import unique_address
from tests.support.factories import api_user

pytestmark = pytest.mark.django_db
SECRET = "a-sound-secret-of-at-least-thirty-two-bytes"
NESTED = "[" * 200_000
User = get_user_model()


class Receiver:
    """Answers every POST with ``status`` (and a Location), recording what came."""

    def __init__(self, status: int = 204, location: str = "") -> None:
        self.hits: list[str] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                receiver.hits.append(self.path)
                self.send_response(status)
                if location:
                    self.send_header("Location", location)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receivers() -> Iterator[list[Receiver]]:
    made: list[Receiver] = []
    yield made
    for r in made:
        r.close()


def _fire_topic(name: str, url: str, **fields) -> TimeoutJob:
    """An http topic row aimed at ``url``, one job fired by an inline worker; the job after."""
    timeout_topic_save(topic=TimeoutTopic(name=name), type="http", target=url, secret=SECRET,
                       allow_http=True, max_attempts=1, **fields)  # fmt: skip
    job = timeout_job_create(topic=name, biz_type="sec", biz_id="1",
                             action_time=timezone.now() - timedelta(seconds=1))  # fmt: skip
    from reminders.engine import queue

    queue.schedule(name, str(job.pk), epoch_ms(job.action_time), slot=job.slot)
    worker = build_worker([name])
    try:
        worker.run_until_idle()
    finally:
        worker.shutdown()
        topic_model.unregister_topic(name)
    job.refresh_from_db()
    return job


# --- brute force ----------------------------------------------------------------------------------


@pytest.mark.parametrize("surface", ["admin", "token"])
def test_brute_force_sign_in_is_locked_out(surface, settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    user, _ = api_user(staff=True)
    user.set_password("the-right-one-123")
    user.save()
    client = Client(REMOTE_ADDR=unique_address())  # the throttle counters are shared
    url, fields = "/api/auth/token/", {"username": user.username}
    kind = {"content_type": "application/json"}  # the API reads JSON bodies only
    if surface == "admin":
        url, fields = "/admin/login/", {"username": user.username, "next": "/admin/"}
        kind = {}  # the admin's form
    answers = [client.post(url, {**fields, "password": "wrong"}, **kind).status_code
               for _ in range(settings.AXES_FAILURE_LIMIT + 2)]  # fmt: skip
    assert answers[-1] == 429
    locked = client.post(url, {**fields, "password": "the-right-one-123"}, **kind)
    assert locked.status_code == 429 and "locked" in locked.content.decode().lower()


# --- redirects, schemes, private targets ----------------------------------------------------------


@pytest.mark.parametrize("surface", ["outbound call", "http topic"])
def test_a_redirect_is_a_failure_and_never_followed(surface, receivers, settings):
    settings.WEBHOOK_ALLOW_HTTP = settings.WEBHOOK_ALLOW_PRIVATE = True
    target = Receiver()
    redirecting = Receiver(status=307, location=target.url)
    receivers += [target, redirecting]
    if surface == "outbound call":
        with pytest.raises(OutboundCallFailed, match="redirect"):
            post_signed(redirecting.url, b"{}", secrets=[SECRET], idempotency_key="k")
    else:
        job = _fire_topic("sec.redirect", redirecting.url)
        assert job.status == TimeoutJob.Status.DEAD and "redirect" in job.last_error
    assert redirecting.hits and not target.hits


@pytest.mark.parametrize("url", ["http://hooks.example.com/x", "HTTP://hooks.example.com/x",
                                 "Http://hooks.example.com/x"])  # fmt: skip
@pytest.mark.parametrize("surface", ["outbound call", "topic row"])
def test_plain_http_is_refused_in_any_case(surface, url, settings):
    settings.WEBHOOK_ALLOW_HTTP = False
    if surface == "outbound call":
        with pytest.raises(ValueError, match="plain-HTTP"):
            check_target(url)
    else:
        with pytest.raises(ValidationError, match="plain-HTTP"):
            timeout_topic_save(topic=TimeoutTopic(name="sec.plain"), type="http", target=url,
                               secret=SECRET)  # fmt: skip
        assert not TimeoutTopic.objects.exists()


@pytest.mark.parametrize("surface", ["outbound call", "http topic"])
def test_a_loopback_target_is_refused_unless_allowed(surface, receivers, settings):
    settings.WEBHOOK_ALLOW_HTTP, settings.WEBHOOK_ALLOW_PRIVATE = True, False
    receiver = Receiver()
    receivers.append(receiver)
    if surface == "outbound call":
        with pytest.raises(OutboundCallFailed, match="refused"):
            post_signed(receiver.url, b"{}", secrets=[SECRET], idempotency_key="k")
    else:
        job = _fire_topic("sec.private", receiver.url)
        assert job.status == TimeoutJob.Status.DEAD and "refused" in job.last_error
    assert receiver.hits == []


# --- secrets --------------------------------------------------------------------------------------


@pytest.mark.parametrize("secret", ["", "short", "x" * 31])
@pytest.mark.parametrize("surface", ["outbound call", "topic row", "settings topic"])
def test_a_guessable_secret_is_refused(surface, secret, settings):
    if surface == "outbound call":
        with pytest.raises(ValueError, match="32 bytes"):
            post_signed("https://hooks.example.com/x", b"{}", secrets=[secret], idempotency_key="k")
    elif surface == "topic row":
        with pytest.raises(ValidationError, match="32 bytes"):
            timeout_topic_save(topic=TimeoutTopic(name="sec.secret"), type="http",
                               target="https://hooks.example.com/x", secret=secret)  # fmt: skip
    else:
        settings.TIMEOUT_TOPICS = {
            "sec.settings": {"type": "http", "secret": secret, "url": "https://hooks.example.com/x"}
        }
        with pytest.raises(ImproperlyConfigured, match="32 bytes"):
            settings_topic_specs()


@pytest.mark.parametrize("secret", ["x" * 40, "abcd" * 10, "abcdefghijklmnopqrstuvwxyzABCDEF"])
@pytest.mark.parametrize("surface", ["topic API", "settings topic", "webhook gateway"])
def test_a_long_but_guessable_secret_is_refused(surface, secret, settings):
    if surface == "topic API":
        client = Client(HTTP_AUTHORIZATION=f"Token {api_user(staff=True)[1]}")
        body = {"name": "sec.secret", "type": "http", "target": "https://hooks.example.com/x",
                "secret": secret}  # fmt: skip
        refused = client.post("/api/timeout-topics/", body, content_type="application/json")
        assert refused.status_code == 400
        assert "guessable" in " ".join(refused.json()["errors"]["secret"])
        assert not TimeoutTopic.objects.filter(name="sec.secret").exists()
    elif surface == "settings topic":
        settings.TIMEOUT_TOPICS = {
            "sec.settings": {"type": "http", "secret": secret, "url": "https://hooks.example.com/x"}
        }
        with pytest.raises(ImproperlyConfigured, match="guessable"):
            settings_topic_specs()
    else:
        settings.NOTIFY_WEBHOOK_SECRET = secret
        with pytest.raises(ValueError, match="guessable"):
            WebhookGateway(url="https://hooks.example.com/hook")


# --- parsers and live settings --------------------------------------------------------------------


@pytest.mark.parametrize("url", ["/api/auth/token/", "/api/timeouts/", "/api/timeouts/bulk/",
                                 "/api/timeout-topics/", "/api/ops/config/"])  # fmt: skip
def test_a_body_that_exhausts_the_parser_is_a_400_everywhere(url):
    _, token = api_user(staff=True)
    client = Client(HTTP_AUTHORIZATION=f"Token {token}", REMOTE_ADDR=unique_address())
    method = client.patch if url == "/api/ops/config/" else client.post
    response = method(url, NESTED, content_type="application/json")
    assert response.status_code == 400, (url, response.status_code)
    assert "errors" in json.loads(response.content)


@pytest.mark.parametrize(
    "body",
    [{"reminder": {"late_limit": "P999999999D", "late_policy": "drop"}},
     {"reminder": {"late_limit": "-PT1S"}},
     {"expiry": {"retention": "P999999999D"}},
     {"reminder": {"prestage_ms": 10**9}}],
)  # fmt: skip
def test_out_of_bounds_live_settings_are_a_400_and_change_nothing(body):
    _, token = api_user(staff=True)
    client = Client(HTTP_AUTHORIZATION=f"Token {token}", REMOTE_ADDR=unique_address())
    before = client.get("/api/ops/config/").json()
    response = client.patch("/api/ops/config/", json.dumps(body), content_type="application/json")
    assert response.status_code == 400, response.content
    assert client.get("/api/ops/config/").json() == before


# --- staff permissions and callable targets -------------------------------------------------------


def _none(model, **lookup) -> Callable[[], bool]:
    return lambda: not model.objects.filter(**lookup).exists()


def _reproduce(attack: str) -> tuple[str, str, dict, Callable[[], bool]]:
    """The issue's reproduction of ``attack``: (method, url, body, "nothing changed" check)."""
    if attack == "mint an all-powerful account":
        every = ["act_for_any_user", "manage_coupons", "manage_timeouts"]
        body = {"username": "sec-mint", "permissions": every}
        return "post", "/api/accounts/", body, _none(User, username="sec-mint")
    if attack == "take another tenant's token":
        tenant, token, _ = accounts.account_provision(
            username="sec-tenant", permissions=("manage_timeouts",), api_only=True
        )

        def kept() -> bool:
            tenant_now = User.objects.get(pk=tenant.pk)
            return tenant_now.has_perm("reminders.manage_timeouts") and (
                Token.objects.get(user=tenant).key == token
            )

        return "post", "/api/accounts/", {"username": "sec-tenant"}, kept
    if attack == "pause reminders":
        body = {"reminder": {"paused": True}}
        return "patch", "/api/ops/config/", body, _none(ReminderSettings, paused=True)
    if attack == "create a coupon":
        body = {
            "name": "sec",
            "claim_opens_at": "2031-01-01T00:00:00Z",
            "total_stock": 5,
            "valid_for": "P7D",
        }
        return "post", "/api/coupons/", body, _none(Coupon)
    body = {"name": "sec.call", "type": "callable", "target": "builtins.print"}
    return "post", "/api/timeout-topics/", body, _none(TimeoutTopic)


@pytest.mark.parametrize("attack", ["mint an all-powerful account", "take another tenant's token",
                                    "pause reminders", "create a coupon",
                                    "create a callable topic"])  # fmt: skip
def test_staff_without_permissions_is_refused_and_changes_nothing(attack):
    _, token = api_user(staff=True, staff_perms=())
    client = Client(HTTP_AUTHORIZATION=f"Token {token}", REMOTE_ADDR=unique_address())
    method, url, body, unchanged = _reproduce(attack)
    response = getattr(client, method)(url, json.dumps(body), content_type="application/json")
    assert response.status_code == 403, response.content
    assert "token" not in response.json()
    assert unchanged()


@pytest.mark.parametrize("target", ["builtins.print", "os.system"])
def test_a_superuser_may_not_create_a_callable_topic_outside_the_allow_list(target, settings):
    settings.TIMEOUT_CALLABLE_TARGETS = ["tests.reminders.test_timeouts_handlers.record_call"]
    token = Token.objects.create(user=User.objects.create(username="sec-root", is_staff=True,
                                                          is_superuser=True))  # fmt: skip
    client = Client(HTTP_AUTHORIZATION=f"Token {token.key}", REMOTE_ADDR=unique_address())
    body = {"name": "sec.call", "type": "callable", "target": target}
    response = client.post("/api/timeout-topics/", body, content_type="application/json")
    assert response.status_code == 400 and "target" in response.json()["errors"]
    assert not TimeoutTopic.objects.exists()
