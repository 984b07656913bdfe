"""OpenTelemetry: one trace from the enqueue to the run, carried in the row's headers."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from pgtasks import Celery

trace = pytest.importorskip("opentelemetry.trace")
sdk_trace = pytest.importorskip("opentelemetry.sdk.trace")
export = pytest.importorskip("opentelemetry.sdk.trace.export")
in_memory = pytest.importorskip("opentelemetry.sdk.trace.export.in_memory_span_exporter")

EXPORTER = in_memory.InMemorySpanExporter()


@pytest.fixture(scope="module", autouse=True)
def provider() -> None:
    """The process's tracer provider can be set once: this module's, exporting to memory."""
    current = trace.get_tracer_provider()
    if not isinstance(current, sdk_trace.TracerProvider):
        tracer_provider = sdk_trace.TracerProvider()
        tracer_provider.add_span_processor(export.SimpleSpanProcessor(EXPORTER))
        trace.set_tracer_provider(tracer_provider)
    else:
        current.add_span_processor(export.SimpleSpanProcessor(EXPORTER))


def test_enqueue_and_run_share_one_trace(
    app: Celery, db: psycopg.Connection[Any], worker_factory: Any
) -> None:
    @app.task(name="traced.add")
    def add(x: int, y: int) -> int:
        return x + y

    @app.task(name="traced.fail", max_retries=0)
    def fail() -> None:
        raise RuntimeError("broken")

    EXPORTER.clear()
    tracer = trace.get_tracer("tests")
    with worker_factory(), tracer.start_as_current_span("web request") as request_span:
        result = add.delay(2, 3)
        assert result.get(timeout=10) == 5
        failing = fail.delay()
        with pytest.raises(RuntimeError):
            failing.get(timeout=10)
    headers = db.execute("SELECT headers FROM tasks WHERE id = %s", (result.id,)).fetchone()
    assert headers is not None and "traceparent" in headers[0]
    spans = {s.name: s for s in EXPORTER.get_finished_spans()}
    send, run = spans["send traced.add"], spans["run traced.add"]
    trace_id = request_span.get_span_context().trace_id
    assert send.context.trace_id == run.context.trace_id == trace_id
    assert send.kind == trace.SpanKind.PRODUCER and run.kind == trace.SpanKind.CONSUMER
    assert run.parent is not None and run.parent.span_id == send.context.span_id
    assert run.attributes["messaging.message.id"] == result.id
    assert send.attributes["messaging.destination.name"] == "celery"
    assert spans["run traced.fail"].status.status_code == trace.StatusCode.ERROR
