"""Client teams generate SDKs from ``/api/schema/``: a Python client made by openapi-python-client
from the running service's schema imports as generated (no hand patch) and runs the main flows
against it, with typed answers and typed errors (409 codes are enums).

The service runs in a live server thread on the real database and Redis; the reminder is
delivered by an in-process worker drain (as in test_flow), everything else goes over HTTP through
the generated code only.
"""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from reminders.members import REMINDER_TOPIC
from reminders.runtime.worker import build_worker
from tests.support.factories import api_user

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

PACKAGE = "cc_client"
USER = 4242


def _generator() -> str:
    found = shutil.which("openapi-python-client", path=str(Path(sys.executable).parent))
    assert found, "openapi-python-client is a dev dependency (pyproject.toml)"
    return found


@pytest.fixture
def client_module(live_server, tmp_path, monkeypatch):
    config = tmp_path / "config.yaml"
    config.write_text("post_hooks: []\nproject_name_override: cc-client\n"
                      f"package_name_override: {PACKAGE}\n")  # fmt: skip
    result = subprocess.run(
        [_generator(), "generate", "--url", f"{live_server.url}/api/schema/?format=json",
         "--config", str(config), "--meta", "none", "--output-path", str(tmp_path / PACKAGE)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Warning" not in result.stdout + result.stderr, result.stdout + result.stderr
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m == PACKAGE or m.startswith(PACKAGE + ".")]:
        del sys.modules[name]
    return importlib.import_module(PACKAGE)


class _api:  # noqa: N801 - reads as a module: _api("users").users_coupons_claim.sync(...)
    """A generated tag package whose operation modules import on first use."""

    def __init__(self, tag: str) -> None:
        self.tag = tag

    def __getattr__(self, operation: str):
        return importlib.import_module(f"{PACKAGE}.api.{self.tag}.{operation}")


def _model(name: str):
    return getattr(importlib.import_module(f"{PACKAGE}.models"), name)


def test_the_main_flows_through_a_generated_client(client_module, live_server, eager_celery,
                                                   reminder_settings):  # fmt: skip
    _, staff_token = api_user(staff=True)
    staff = client_module.AuthenticatedClient(base_url=live_server.url, token=staff_token,
                                              prefix="Token")  # fmt: skip
    accounts, coupons = _api("accounts"), _api("coupons")
    users, timeouts = _api("users"), _api("timeouts")

    # An end user's app account, made by staff through the API.
    made = accounts.accounts_ensure.sync(
        client=staff, body=_model("AccountInputRequest")(username="app-4242", user_id=USER)
    )
    assert isinstance(made, _model("AccountOutput")), made
    app = client_module.AuthenticatedClient(base_url=live_server.url, token=made.token,
                                            prefix="Token")  # fmt: skip

    # A business rule the schema states (not both of expires_at and valid_for). Typed 400.
    now = timezone.now()
    coupon_input = _model("CouponInputRequest")
    bad = coupons.coupons_create.sync(client=staff, body=coupon_input(
        name="Both", claim_opens_at=now + timedelta(hours=1), total_stock=5,
        valid_for="P7D", expires_at=now + timedelta(days=9)))  # fmt: skip
    assert isinstance(bad, _model("ValidationError")), bad
    assert "valid_for" in bad.errors.additional_properties

    # Create: one coupon opening in 30 s (its reminder is due now), one open already; the
    # opening on a whole second that is not a whole minute, as the message says it.
    opens = now.replace(microsecond=0) + timedelta(seconds=30)
    opens += timedelta(seconds=1) if opens.second == 0 else timedelta(0)
    soon = coupons.coupons_create.sync(client=staff, body=coupon_input(
        name="Lunch deal", claim_opens_at=opens, total_stock=10,
        valid_for="P7D"))  # fmt: skip
    open_now = coupons.coupons_create.sync(client=staff, body=coupon_input(
        name="Coffee", claim_opens_at=now - timedelta(seconds=1), total_stock=10,
        valid_for="PT1H"))  # fmt: skip
    assert isinstance(soon, _model("CouponOutput")) and soon.valid_for == "P7D", soon
    assert open_now.valid_for == "PT1H"

    # Subscribe to the reminder, then it is delivered and read in the inbox.
    subscribed = users.users_reminders_update.sync_detailed(USER, soon.id, client=app)
    assert subscribed.status_code == 201, subscribed.content
    worker = build_worker([REMINDER_TOPIC])
    try:
        worker.run_until_idle()
    finally:
        worker.shutdown()
    inbox = users.users_notifications_list.sync(USER, client=app, unread=True)
    assert [n.title for n in inbox.results] == [
        f"Lunch deal opens at {timezone.localtime(soon.claim_opens_at):%H:%M:%S %Z}"
    ]
    read = users.users_notifications_read_all.sync(USER, client=app)
    assert read.marked == 1
    assert users.users_notifications_list.sync(USER, client=app, unread=True).results == []

    # Claim: too early is a typed 409 with its code enum and the opening time.
    claim_input = _model("ClaimInputRequest")
    early = users.users_coupons_claim.sync(USER, client=app, body=claim_input(coupon=soon.id))
    assert isinstance(early, _model("ClaimConflict")), early
    assert early.code == _model("ClaimConflictCodeEnum").NOT_OPEN
    assert early.opens_at == soon.claim_opens_at
    claimed = users.users_coupons_claim.sync(USER, client=app, body=claim_input(coupon=open_now.id))
    assert isinstance(claimed, _model("UserCouponOutput")), claimed
    missing = users.users_coupons_claim.sync(USER, client=app, body=claim_input(coupon=999_999))
    assert isinstance(missing, _model("DetailError")), missing

    # Redeem, and a second redeem is a typed 409.
    used = users.users_coupons_redeem.sync(USER, claimed.id, client=app)
    assert used.status == _model("UserCouponOutputStatusEnum").USED
    again = users.users_coupons_redeem.sync(USER, claimed.id, client=app)
    assert again.code == _model("RedeemConflictCodeEnum").ALREADY_USED

    # A timeout: created, then cancelled by its business key (no job_id kept).
    job = timeouts.timeouts_create.sync(client=staff, body=_model("TimeoutJobInputRequest")(
        topic="timeout.default", biz_type="order", biz_id="A-1",
        action_time=now + timedelta(hours=1)))  # fmt: skip
    assert isinstance(job, _model("TimeoutJobOutput")), job
    key = {"topic": "timeout.default", "biz_type": "order", "biz_id": "A-1"}
    cancelled = timeouts.timeouts_by_key_destroy.sync(client=staff, **key)
    assert cancelled.job_id == job.job_id and cancelled.status == "cancelled"
    twice = timeouts.timeouts_by_key_destroy.sync(client=staff, **key)
    assert isinstance(twice, _model("TimeoutJobCancelConflict")), twice
