"""Optional OpenTelemetry tracing (extra ``otel``): a span per request stage.

Without the extra, ``span()`` is a no-op context manager and nothing is imported. With it, spans go to
whatever tracer provider is installed: ``setup_tracing`` (called by the CLI) installs one exporting over
OTLP/HTTP when ``HYOCR_OTEL_ENDPOINT`` is set.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
from collections.abc import Iterator

log = logging.getLogger("hyocr.tracing")
_AVAILABLE = importlib.util.find_spec("opentelemetry") is not None


@contextlib.contextmanager
def span(name: str, *, current: bool = True, **attributes: object) -> Iterator[None]:
    """``with span("hyocr.engine", request_id=...)``: a child of the current span, if tracing is on (a tracer
    provider installed: ``setup_tracing``'s, or the application's own). ``current=False`` for a span around a
    generator's yields: it is not made the current context, whose attach and detach would then fall in
    different tasks when the consumer steps the generator from several (the web UI does: OpenTelemetry logged
    "Failed to detach context" as an error for every page)."""
    if not _AVAILABLE:
        yield
        return
    from opentelemetry import trace

    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):  # none installed: spans go nowhere
        yield
        return
    tracer = trace.get_tracer("hyocr")
    if current:
        with tracer.start_as_current_span(name) as opened:
            _describe(opened, attributes)
            yield
        return
    opened = tracer.start_span(name)  # parent: the current span, as above
    _describe(opened, attributes)
    try:
        yield
    finally:
        opened.end()


def _describe(opened, attributes: dict[str, object]) -> None:
    for key, value in attributes.items():
        if value is not None:
            opened.set_attribute(f"hyocr.{key}", value if isinstance(value, (str, int, float, bool)) else str(value))


def setup_tracing(endpoint: str | None, service_name: str = "hyocr") -> None:
    if not endpoint:
        return
    try:
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning('HYOCR_OTEL_ENDPOINT is set but tracing is not installed: pip install "hyocr[otel]"')
        return
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    trace.set_tracer_provider(provider)
    log.info("tracing to %s", endpoint)
