"""OpenTelemetry traces, off unless an OTLP endpoint is configured (``OTEL_EXPORTER_OTLP_ENDPOINT``
or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``; the standard ``OTEL_*`` variables apply: service name,
headers, sampler).

What is traced: the official instrumentations for Django (each request), Celery (publish and run
of each task), psycopg2 and SQLite (each query: production's PostgreSQL and the embedded
development default) and Redis (each command); and, per scheduled job, its life
after the API call that scheduled it. The call's trace context is stored with the job
(``traceparent``, W3C format, on the subscription or timeout row, only when it was sampled), and
the worker that delivers or fires it opens a span in that same trace, from the job's due time to
its outcome, linked to the Celery task or worker round that did the work. So one trace shows the
API call, how long the job waited past its due moment, and where the delivery's time went.

``setup()`` is called once per process (web: app ready; Celery: each pool child; workers: at
start); tests install an in-memory exporter with ``setup(exporter=...)``.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

logger = logging.getLogger(__name__)
TRACER = "couponcenter"
_propagator = TraceContextTextMapPropagator()
_lock = threading.Lock()
_installed = False


def configured() -> bool:
    return bool(
        os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


def setup(*, exporter: Any = None) -> bool:
    """Install the tracer provider and the instrumentations, once per process (later calls do
    nothing). Without an endpoint (and no ``exporter`` given) nothing is installed and tracing
    costs nothing."""
    global _installed
    if exporter is None and not configured():
        return False
    with _lock:
        if _installed:
            return True
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

        resource = Resource.create(
            {"service.name": os.environ.get("OTEL_SERVICE_NAME", "couponcenter")}
        )
        provider = TracerProvider(resource=resource)
        if exporter is not None:
            provider.add_span_processor(SimpleSpanProcessor(exporter))
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        trace.set_tracer_provider(provider)
        _instrument()
        _installed = True
        logger.info("tracing on: %s", "in-memory" if exporter is not None else "OTLP")
        return True


def _instrument() -> None:
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.instrumentation.django import DjangoInstrumentor
    from opentelemetry.instrumentation.psycopg2 import Psycopg2Instrumentor
    from opentelemetry.instrumentation.redis import RedisInstrumentor
    from opentelemetry.instrumentation.sqlite3 import SQLite3Instrumentor

    for instrumentor in (
        DjangoInstrumentor(),
        CeleryInstrumentor(),
        Psycopg2Instrumentor(),
        SQLite3Instrumentor(),
        RedisInstrumentor(),
    ):
        if not instrumentor.is_instrumented_by_opentelemetry:
            instrumentor.instrument()


def tracer() -> trace.Tracer:
    return trace.get_tracer(TRACER)


def enabled() -> bool:
    return _installed


def current_traceparent() -> str:
    """The active span's context as a W3C ``traceparent``, when it is sampled; else ""."""
    if not _installed:
        return ""
    span_context = trace.get_current_span().get_span_context()
    if not span_context.is_valid or not span_context.trace_flags.sampled:
        return ""
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    return carrier.get("traceparent", "")


@contextmanager
def job_span(
    name: str,
    traceparent: str,
    *,
    due: datetime | None = None,
    attributes: dict[str, Any] | None = None,
) -> Iterator[trace.Span | None]:
    """A span in the trace that scheduled the job (``traceparent``), from its due moment (when
    given) to the end of the block, linked to whatever span is running here (the Celery task,
    the worker round). None when tracing is off or the job carries no context."""
    if not _installed or not traceparent:
        yield None
        return
    parent = _propagator.extract({"traceparent": traceparent})
    here = trace.get_current_span().get_span_context()
    links = [Link(here)] if here.is_valid else []
    start = int(due.timestamp() * 1e9) if due is not None else None
    span = tracer().start_span(
        name,
        context=parent,
        kind=SpanKind.CONSUMER,
        links=links,
        attributes=attributes or {},
        start_time=start,
    )
    token = otel_context.attach(trace.set_span_in_context(span))
    try:
        yield span
    except Exception as exc:
        span.record_exception(exc)
        span.set_status(Status(StatusCode.ERROR, str(exc)[:200]))
        raise
    finally:
        otel_context.detach(token)
        span.end()


def end_job_span(
    name: str,
    traceparent: str,
    *,
    due: datetime | None,
    outcome: str,
    attributes: dict[str, Any] | None = None,
) -> None:
    """A finished job span, for code that learns the outcome of many jobs at once."""
    with job_span(name, traceparent, due=due, attributes=attributes) as span:
        if span is not None:
            span.set_attribute("couponcenter.outcome", outcome)
            if outcome not in ("delivered", "fired", "acked"):
                span.set_status(Status(StatusCode.ERROR, outcome))
