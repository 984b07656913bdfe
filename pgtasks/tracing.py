"""OpenTelemetry spans, where the ``opentelemetry-api`` package is installed.

Enqueueing a task opens a PRODUCER span (``send <task>``) and writes its trace context
(``traceparent``/``tracestate``) into the row's headers; the worker opens a CONSUMER span
(``run <task>``) whose parent is read back from those headers, so one trace follows a call from
the web request that made it to the process that ran it, across hosts and retries. The spans go
wherever the application's tracer provider sends them; without the API installed every helper
here does nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

try:
    from opentelemetry import propagate, trace
    from opentelemetry.trace import SpanKind, Status, StatusCode
except ImportError:  # the API is optional
    trace = None  # type: ignore[assignment]

#: ``inject(headers, queue)``: write the current trace context into a row's headers.
Inject = Callable[[dict[str, Any], str], None]


def _no_inject(headers: dict[str, Any], queue: str) -> None:
    return None


_NO_PRODUCER: AbstractContextManager[Inject] = nullcontext(_no_inject)
_NO_CONSUMER: AbstractContextManager[Any] = nullcontext(None)


def enabled() -> bool:
    """Whether the OpenTelemetry API is importable here."""
    return trace is not None


def _recording() -> bool:
    """Whether an application has installed a tracer provider. Until one is, every span is a
    no-op and carries no context, so the helpers skip the work (the hot path stays cheap)."""
    provider = trace.get_tracer_provider()
    return not isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider))


def producer(task_name: str) -> AbstractContextManager[Inject]:
    """``with producer(name) as inject: ...; inject(headers, queue)`` around an enqueue."""
    if trace is None or not _recording():
        return _NO_PRODUCER
    return _producer(task_name)


@contextmanager
def _producer(task_name: str) -> Iterator[Inject]:
    tracer = trace.get_tracer("pgtasks")
    attributes = {"messaging.system": "pgtasks", "messaging.operation.type": "send"}
    with tracer.start_as_current_span(
        f"send {task_name}", kind=SpanKind.PRODUCER, attributes=attributes
    ) as span:

        def inject(headers: dict[str, Any], queue: str) -> None:
            propagate.inject(headers)
            span.set_attribute("messaging.destination.name", queue)

        yield inject


def consumer(
    task_name: str, task_id: str, headers: dict[str, Any], attempt: int
) -> AbstractContextManager[Any]:
    """The span a worker runs a task in, continuing the trace its headers carry."""
    if trace is None or not _recording():
        return _NO_CONSUMER
    return _consumer(task_name, task_id, headers, attempt)


@contextmanager
def _consumer(task_name: str, task_id: str, headers: dict[str, Any], attempt: int) -> Iterator[Any]:
    tracer = trace.get_tracer("pgtasks")
    parent = propagate.extract({k: v for k, v in headers.items() if isinstance(v, str)})
    attributes: dict[str, str | int] = {
        "messaging.system": "pgtasks",
        "messaging.operation.type": "process",
        "messaging.message.id": task_id,
        "pgtasks.task.name": task_name,
        "pgtasks.task.attempt": attempt,
    }
    with tracer.start_as_current_span(
        f"run {task_name}", context=parent, kind=SpanKind.CONSUMER, attributes=attributes
    ) as span:
        yield span


def failed(span: Any, error: str | None) -> None:
    """Mark a consumer span as failed (no-op without the API or outside a span)."""
    if trace is not None and span is not None:
        span.set_status(Status(StatusCode.ERROR, error or "failed"))
