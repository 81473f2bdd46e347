"""The claim's front door: ``POST /api/users/{id}/coupons/`` answered at the WSGI entry, before
Django's middleware chain and URL resolver, when the lean path takes it (docs/claims.md, "The
front door").

In a rush most answers are refusals that cost the lean path little; the middleware chain around
it (nine layers, each a call in and a call out), the resolver and the handler's bookkeeping cost
more than the claim. The front door does for this one request what that chain would do for it:

- as Django's handler: the ``request_started`` signal (the connections' health checks), the
  script prefix, an error turned into its answer (``response_for_exception``: logged, the API's
  500), a 4xx logged, the request closed and ``request_finished`` sent when the server closes the
  answer;
- as the middleware that applies to a token-authenticated API call: the live settings as of the
  request's start; ``SecurityMiddleware`` and ``CommonMiddleware`` (the host checked against
  ``ALLOWED_HOSTS``, an HTTPS redirect or a refused user agent left to Django, their headers and
  ``Content-Length`` added); ``XFrameOptionsMiddleware``'s header. Sessions, CSRF (the view is
  exempt; a token is no cookie), the user from the session, messages and axes (logins) have
  nothing to do for it.

Anything else goes to Django as it came, and so does a claim the lean path declines (its body,
once read, is handed on). The door stays shut (every request goes to Django) when the middleware
list is not the one above, so a middleware added later is never skipped unnoticed, and while
tracing is installed, so that every request is traced by Django's instrumentation.
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core import signals
from django.core.handlers.exception import response_for_exception
from django.core.handlers.wsgi import WSGIHandler, WSGIRequest, get_script_name
from django.http import HttpResponseBase
from django.middleware.clickjacking import XFrameOptionsMiddleware
from django.middleware.common import CommonMiddleware
from django.middleware.security import SecurityMiddleware
from django.urls import set_script_prefix, set_urlconf
from django.utils.log import log_response

from couponcenter.core import tracing
from couponcenter.core.live_settings import as_of_now
from couponcenter.coupons.api.claims import UserCouponListApi

# The middleware the front door stands in for; with any other list it stays shut.
MIDDLEWARE = (
    "couponcenter.core.middleware.LiveSettingsAsOfRequestMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "couponcenter.core.middleware.LazyMessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "axes.middleware.AxesMiddleware",
)
# The claim's URL as ``couponcenter/coupons/api/urls.py`` routes it (``<int:user_id>``).
CLAIM_PATH = re.compile(r"/api/users/([0-9]+)/coupons/")


def _never_called(request: Any) -> HttpResponseBase:
    raise AssertionError("the front door calls its middleware's hooks, never the chain")


class ClaimFrontDoor:
    """A WSGI application: the claim answered here when it can be, everything else by
    ``django_app``."""

    def __init__(self, django_app: WSGIHandler) -> None:
        self.django_app = django_app
        self.security = SecurityMiddleware(_never_called)
        self.common = CommonMiddleware(_never_called)
        self.x_frame = XFrameOptionsMiddleware(_never_called)

    def open(self) -> bool:
        """Whether claims may come in here (read per request: tests change the settings)."""
        return tuple(settings.MIDDLEWARE) == MIDDLEWARE and not tracing.enabled()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]):
        if environ.get("REQUEST_METHOD") == "POST":
            match = CLAIM_PATH.fullmatch(environ.get("PATH_INFO", ""))
            if match is not None and self.open():
                response = self._claim(environ, int(match.group(1)))
                if response is not None:
                    return self._answer(response, start_response)
        return self.django_app(environ, start_response)

    def _claim(self, environ: dict[str, Any], user_id: int) -> HttpResponseBase | None:
        """The claim's answer; None: Django answers it (``environ`` as Django must read it)."""
        set_script_prefix(get_script_name(environ))
        signals.request_started.send(sender=self.__class__, environ=environ)
        request = WSGIRequest(environ)
        try:
            with as_of_now():
                response = self._lean(request, user_id)
        except Exception as exc:  # noqa: BLE001 - as the outermost of Django's own wrappers
            response = response_for_exception(request, exc)
        if response is None:
            request.close()
            signals.request_finished.send(sender=self.__class__)
            if hasattr(request, "_body"):  # read by the lean path: Django reads it again
                environ["wsgi.input"] = io.BytesIO(request._body)
            return None
        response._resource_closers.append(request.close)
        if response.status_code >= 400:
            log_response(
                "%s: %s", response.reason_phrase, request.path, response=response, request=request
            )
        return response

    def _lean(self, request: WSGIRequest, user_id: int) -> HttpResponseBase | None:
        set_urlconf(settings.ROOT_URLCONF)
        # Their requests' checks: a redirect (HTTPS, a missing ``www``) or a refusal (a
        # disallowed user agent, a host not allowed) is Django's to answer.
        if self.security.process_request(request) is not None:
            return None
        try:
            if self.common.process_request(request) is not None:
                return None
        except Exception:  # noqa: BLE001 - DisallowedHost, PermissionDenied: Django answers
            return None
        view = UserCouponListApi()
        view.setup(request, user_id=user_id)
        try:
            response = view.claim_lean(request, user_id)
        except Exception as exc:  # noqa: BLE001 - answered as Django's handler answers it
            response = response_for_exception(request, exc)
        if response is None:
            return None
        response = self.x_frame.process_response(request, response)
        response = self.common.process_response(request, response)
        return self.security.process_response(request, response)

    def _answer(self, response: HttpResponseBase, start_response: Callable[..., Any]):
        """As ``WSGIHandler.__call__`` hands a response to the server."""
        response._handler_class = self.__class__
        start_response(
            f"{response.status_code} {response.reason_phrase}",
            [
                *response.items(),
                *(("Set-Cookie", c.output(header="")) for c in response.cookies.values()),
            ],
        )
        return response
