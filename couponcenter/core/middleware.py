"""Middleware of our own."""

from __future__ import annotations

from collections.abc import Callable

from django.contrib.messages.middleware import MessageMiddleware
from django.contrib.messages.storage import default_storage
from django.http import HttpRequest, HttpResponseBase
from django.utils.functional import SimpleLazyObject, empty

from couponcenter.core.live_settings import as_of_now


class LiveSettingsAsOfRequestMiddleware:
    """Each request sees the live configuration as of its start (``live_settings.as_of_now``): a
    change committed before it began, by whichever process, is never refused or missed."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        with as_of_now():
            return self.get_response(request)


class LazyMessageMiddleware(MessageMiddleware):
    """Django's message middleware, but the storage is built on first use.

    Only the admin uses messages; building the storage (cookie and session backends) on every
    API request would cost a claim a sizeable share of its CPU. A request that never touched its
    messages has nothing to store in the response.
    """

    def process_request(self, request: HttpRequest) -> None:
        request._messages = SimpleLazyObject(lambda: default_storage(request))

    def process_response(
        self, request: HttpRequest, response: HttpResponseBase
    ) -> HttpResponseBase:
        messages = getattr(request, "_messages", None)
        if isinstance(messages, SimpleLazyObject) and messages._wrapped is empty:
            return response
        return super().process_response(request, response)
