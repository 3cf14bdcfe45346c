"""Prometheus metrics: one registry per app, labels with bounded values only (no keys, no file names).

The access-log middleware is the one place a finished request is counted, from what the service
recorded for it (observability/logs.py ``record``), so the log line and the counters never disagree.
GPU gauges come from NVML (nvidia-ml-py) when a GPU exists, and are absent, not faked, otherwise.

With several API processes (``API_PROCESSES``, server/processes.py) prometheus_client runs in
its multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``, set by vLLM's launcher before the processes
start): every process writes its values to files there and a scrape of any one of them reports the
sums over all. Gauges computed at scrape time (``set_function``) cannot work across processes, so
there each process sets them once a second (``refresh``) and the scrape sums the live ones; the admission
gauges are written at each change as well, so that in flight plus finished is never a request counted twice.
"""

from __future__ import annotations

import asyncio
import logging
import os

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily

log = logging.getLogger("hyocr.metrics")

_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 128, 300)
_TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16)
_ERROR_TYPES = {400: "invalid_request", 401: "authentication", 403: "permission", 404: "not_found",
                405: "invalid_request", 413: "payload_too_large", 415: "unsupported_media_type",
                429: "rate_limit", 499: "client_closed", 500: "internal", 502: "upstream",
                503: "unavailable", 504: "timeout"}
_ROUTES = frozenset({"/v1/ocr", "/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/ready",
                     "/metrics", "/v1/jobs", "/v1/jobs/{job_id}", "/v1/jobs/{job_id}/result",
                     "/v1/jobs/{job_id}/pages", "/v1/files", "/v1/files/{file_id}", "/v1/files/{file_id}/content",
                     "/v1/batches", "/v1/batches/{batch_id}", "/v1/batches/{batch_id}/cancel"})
# Probes and scrapes: counted in hyocr_requests_total (a /ready answering 503 is worth seeing), kept out of
# the latency histogram, where a scrape every few seconds would drown the requests it is about.
_UNTIMED = frozenset({"/health", "/ready", "/metrics"})


class Metrics:
    def __init__(self, service=None) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("hyocr_requests", "Finished HTTP requests", ["route", "status"], registry=r)
        self.duration = Histogram("hyocr_request_duration_seconds", "Request latency", ["route"],
                                  buckets=_LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram("hyocr_time_to_first_token_seconds", "Time to the engine's first output",
                              buckets=_TTFT_BUCKETS, registry=r)
        self.errors = Counter("hyocr_errors", "Requests answered with an error", ["type"], registry=r)
        self.timeouts = Counter("hyocr_timeouts", "Requests past their deadline (504)", registry=r)
        self.rejected = Counter("hyocr_rejected", "Requests shed (429 rate limit, 503 overloaded)", ["reason"],
                                registry=r)
        self.stage = Histogram("hyocr_stage_duration_seconds", "Time per pipeline stage", ["stage"],
                               buckets=_LATENCY_BUCKETS, registry=r)
        self.pages = Counter("hyocr_pages", "Pages (images) processed", registry=r)
        self.prompt_tokens = Counter("hyocr_prompt_tokens", "Prompt tokens (images included)", registry=r)
        self.output_tokens = Counter("hyocr_output_tokens", "Generated tokens", registry=r)
        self.repetition_stops = Counter("hyocr_repetition_stops", "Outputs cut by the loop guard", registry=r)
        self.grammar_compile = Histogram("hyocr_grammar_compile_seconds", "Compiling a new output constraint "
                                         "(a schema) to a grammar", buckets=_TTFT_BUCKETS, registry=r)
        self.grammar_cache = Counter("hyocr_grammar_cache", "Requests with an output constraint, by whether its "
                                     "grammar was compiled already (hit) or now (miss)", ["result"], registry=r)
        self.queue = Gauge("hyocr_queue_length", "Requests waiting for admission", registry=r,
                           multiprocess_mode="livesum")
        self.in_flight = Gauge("hyocr_requests_in_flight", "Requests admitted to the engine", registry=r,
                               multiprocess_mode="livesum")
        self.restarts = Gauge("hyocr_engine_restarts", "Engine restarts by the supervisor", registry=r,
                              multiprocess_mode="max")
        # Jobs: counted from the jobs database (every process reads the same one: max, not a sum).
        self.jobs = Gauge("hyocr_jobs", "Jobs by status", ["status"], registry=r, multiprocess_mode="max")
        self.batches = Gauge("hyocr_batches", "OpenAI batches by status", ["status"], registry=r,
                             multiprocess_mode="max")
        self.job_pages = Counter("hyocr_job_pages", "Pages read and stored by jobs", registry=r)
        self.webhooks = Counter("hyocr_webhook_deliveries", "Webhook delivery attempts by result "
                                "(delivered, retried, failed)", ["result"], registry=r)
        # The engine's copies of the model (vLLM data-parallel cores, Ray Serve replicas), alive or not
        # Several API processes see the same shared cores (max), or each its own (HYOCR_OWN_CORES: a sum).
        self.replicas = Gauge("hyocr_engine_replicas", "Engine replicas (engine cores, Ray Serve replicas) by "
                              "state (up, down)", ["state"], registry=r,
                              multiprocess_mode="livesum" if os.environ.get("HYOCR_OWN_CORES") else "max")
        self._sources: dict[Gauge, object] = {}
        if service is not None:
            admission = service.admission
            self.track(self.queue, lambda: admission.waiting)
            self.track(self.in_flight, lambda: admission.in_flight)
            if self.shared:  # written as they change: a value a second old would count a finished request twice
                admission.on_change = lambda: (self.queue.set(admission.waiting),
                                               self.in_flight.set(admission.in_flight))
        engine = getattr(service, "engine", None)  # a service without one: the admission gauges only
        if engine is not None:
            for state, alive in (("up", True), ("down", False)):
                self.track(self.replicas.labels(state),
                           lambda alive=alive: sum(r.alive == alive for r in engine.replicas()))
        self.gpu = GpuCollector.create()
        if self.gpu is not None and not self.shared:
            r.register(self.gpu)
        if engine is not None and engine.info.name == "vllm" and not self.shared:
            r.register(VllmFamilies())  # on /metrics and on METRICS_PORT alike

    @property
    def shared(self) -> bool:
        """True in prometheus_client's multiprocess mode (several API processes)."""
        return bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))

    def track(self, gauge: Gauge, source) -> None:
        """``gauge`` reports ``source()``: read at scrape time, or once a second when shared."""
        if self.shared:
            self._sources[gauge] = source
        else:
            gauge.set_function(source)

    def refresh(self) -> None:
        for gauge, source in self._sources.items():
            gauge.set(source())

    async def refresh_forever(self, interval: float = 1.0) -> None:
        while True:
            self.refresh()
            await asyncio.sleep(interval)

    def scrape_registry(self) -> CollectorRegistry:
        """What a scrape reports: this app's registry, or the sums over every process when shared
        (vLLM's own vllm:* families included, as they live in the same files)."""
        if not self.shared:
            return self.registry
        from prometheus_client import multiprocess

        self.refresh()
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        if self.gpu is not None:
            registry.register(self.gpu)
        return registry

    def observe(self, route: str, status: int, seconds: float, stats: dict) -> None:
        """One finished request: everything it counts, from the figures the service recorded."""
        route = route if route in _ROUTES or route.startswith("/ui") else "other"
        route = "/ui" if route.startswith("/ui") else route
        self.requests.labels(route, str(status)).inc()
        if route not in _UNTIMED:
            self.duration.labels(route).observe(seconds)
        if status >= 400:
            self.errors.labels(_ERROR_TYPES.get(status, "other")).inc()
        if status == 504:
            self.timeouts.inc()
        if status == 429:
            self.rejected.labels("rate_limit").inc()
        if stats.get("rejected"):
            self.rejected.labels(str(stats["rejected"])).inc()
        if "ttft_s" in stats:
            self.ttft.observe(stats["ttft_s"])
        for stage in ("fetch", "decode", "engine", "postprocess"):
            if f"{stage}_ms" in stats:
                self.stage.labels(stage).observe(stats[f"{stage}_ms"] / 1000)
        self.pages.inc(stats.get("images", 0))
        self.prompt_tokens.inc(stats.get("prompt_tokens", 0))
        self.output_tokens.inc(stats.get("output_tokens", 0))
        self.repetition_stops.inc(stats.get("repetition_stops", 0))
        if stats.get("grammar_cache") in ("hit", "miss"):
            self.grammar_cache.labels(stats["grammar_cache"]).inc()
        if "grammar_compile_ms" in stats:
            self.grammar_compile.observe(stats["grammar_compile_ms"] / 1000)


class VllmFamilies:
    """vLLM's own statistics (KV-cache usage, running and waiting sequences, per engine core), which vLLM
    keeps in this process's global registry: its ``vllm:*`` families, read at scrape time. (With several API
    processes they are in the shared multiprocess files instead.)"""

    def collect(self):
        from prometheus_client import REGISTRY

        for family in REGISTRY.collect():
            if family.name.startswith("vllm:"):
                yield family


class GpuCollector:
    """GPU memory and utilisation per device, read from NVML at scrape time."""

    def __init__(self, nvml) -> None:
        self.nvml = nvml

    @classmethod
    def create(cls) -> GpuCollector | None:
        try:
            import pynvml

            pynvml.nvmlInit()
            if pynvml.nvmlDeviceGetCount() == 0:
                return None
        except Exception:  # no library, no driver, no GPU: no gauges
            return None
        return cls(pynvml)

    def collect(self):
        used = GaugeMetricFamily("hyocr_gpu_memory_used_bytes", "GPU memory in use", labels=["gpu"])
        total = GaugeMetricFamily("hyocr_gpu_memory_total_bytes", "GPU memory", labels=["gpu"])
        util = GaugeMetricFamily("hyocr_gpu_utilization_ratio", "GPU busy fraction", labels=["gpu"])
        nvml = self.nvml
        for i in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            used.add_metric([str(i)], memory.used)
            total.add_metric([str(i)], memory.total)
            util.add_metric([str(i)], nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100)
        yield from (used, total, util)
