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
def span(name: str, **attributes: object) -> Iterator[None]:
    """``with span("hyocr.engine", request_id=...)``: a child of the current span, if tracing is on."""
    if not _AVAILABLE:
        yield
        return
    from opentelemetry import trace

    with trace.get_tracer("hyocr").start_as_current_span(name) as current:
        for key, value in attributes.items():
            if value is not None:
                current.set_attribute(f"hyocr.{key}", value if isinstance(value, (str, int, float, bool)) else str(value))
        yield


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
