"""One settings object for the whole process.

Values come from ``HYOCR_*`` environment variables (and a ``.env`` file if present); CLI flags
override them. Validated once, at start-up, with messages that name the setting.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import SettingsConfigDict

from .config_rules import CrossSettingRules
from .pipeline.objects import BucketList, StoreEndpoint

ImageFormat = Literal["PNG", "JPEG", "WEBP", "BMP", "TIFF", "GIF", "JPEG2000"]


class Settings(CrossSettingRules):
    model_config = SettingsConfigDict(
        env_prefix="HYOCR_", env_file=".env", extra="ignore", frozen=True, validate_default=True,
        protected_namespaces=(),  # model_version etc.: pydantic-settings < 2.7 warned on every command
    )

    # --- server ---
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["json", "text"] = Field("json", description="server logs: JSON lines or plain text")
    otel_endpoint: str | None = Field(None, description="OTLP/HTTP traces endpoint (extra otel), e.g. "
                                      "http://collector:4318/v1/traces")
    drain_timeout: float = Field(30.0, ge=0, le=3600, description="seconds to finish in-flight work on SIGTERM")
    ui: bool = Field(True, description="serve the web UI at /ui")
    ui_upload_cache_bytes: int = Field(
        1024 * 1024 * 1024, ge=1024 * 1024, description="web UI: bytes its uploads (and result files) may "
        "take on disk; a new upload evicts the least recently used ones")
    ui_upload_ttl: int = Field(600, ge=1, le=86_400, description="web UI: seconds an upload is kept after "
                               "its last use (then deleted; all of them when the server stops)")
    gil_switch_interval: float | None = Field(
        None, gt=0, le=1, description="seconds a thread may hold the GIL while another waits (Python's default: "
        "0.005); shorter lets the event loop in sooner beside busy image-processing threads")
    api_processes: int = Field(
        1, ge=1, le=64, description="vLLM: HTTP server processes sharing one engine (each with its own event loop, "
        "image processing and output handling); admission limits are split between them")

    # --- engine ---
    engine: str = Field("rapidocr", description="rapidocr | vllm | transformers | openai | fake")
    model: str | None = Field(None, description="model id/path; engine default when unset")
    served_model_name: str | None = Field(None, description="name in /v1/models and responses")
    engine_workers: int = Field(
        0, ge=0, le=64, description="parallel inferences for CPU engines (0 = one per 2 cores)"
    )

    # --- HunyuanOCR model engines (vllm, transformers) ---
    revision: str | None = Field(None, description="hub revision (branch, tag or commit)")
    subfolder: str | None = Field(None, description="checkpoint folder in the repo: v1.0 for HunyuanOCR 1.0")
    model_version: Literal["auto", "1.0", "1.5"] = Field(
        "auto", description="HunyuanOCR version (repetition rules): auto from the checkpoint's context and image size")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    device: str = Field("auto", description="transformers engine: auto | cpu | cuda | cuda:N")
    trust_remote_code: bool = False
    max_num_seqs: int = Field(64, ge=1, le=4096, description="sequences generated together (batch size)")
    batch_wait_ms: float = Field(10.0, ge=0, le=1000, description="transformers: wait to fill a batch")

    # --- vLLM engine ---
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1, description="vLLM: fraction of GPU memory")
    kv_cache_memory_bytes: int | None = Field(None, ge=1, description="vLLM: KV cache size (overrides the fraction)")
    max_model_len: int | None = Field(None, ge=256, description="vLLM: context length")
    max_num_batched_tokens: int | None = Field(None, ge=256, description="vLLM: tokens per scheduler step")
    enforce_eager: bool = Field(False, description="vLLM: no CUDA graphs (faster start, slower decode)")
    tensor_parallel_size: int = Field(1, ge=1, le=64, description="vLLM: GPUs one copy of the model is split over")
    data_parallel_size: int = Field(
        1, ge=1, le=64, description="vLLM: copies of the model (engine cores), each on tensor_parallel_size GPUs of "
        "this host; vLLM balances requests between them")
    engines_per_gpu: int = Field(
        1, ge=1, le=16, description="vLLM: engine cores on each GPU (or tensor-parallel group), each with its own "
        "scheduler process and KV cache share; hyocr balances requests by outstanding work and restarts a dead "
        "core alone. Cards gain (one core's thread is their bound), documents do not (the GPU is)")
    quantization: str | None = Field(None, description="vLLM: awq, gptq, fp8, ...")
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"] = Field(
        "auto", description="vLLM: the KV cache's element type (auto: the model's). fp8 halves the cache and ~8% "
        "of a card's GPU time, at an accuracy cost to measure on your documents (hyocr eval): unscaled FP8. "
        "vLLM's CPU backend: AVX-512 or AMX only")
    swap_space: float | None = Field(None, ge=0, description="vLLM: CPU swap GiB (older vLLM only)")
    lora_modules: str | None = Field(None, description="vLLM: LoRA adapters, name=path[,name=path]; "
                                     "a request selects one with its model field")
    max_lora_rank: int = Field(16, ge=1, le=512, description="vLLM: the largest adapter rank")
    expected_tokens: int | None = Field(
        None, ge=0, le=1_000_000, description="vLLM: prompt + output tokens of a typical request; the KV cache "
        "is sized to max_num_seqs x this. Default: a page at max_pixels with 1024 output tokens (~5200; a card "
        "needs ~850). 0 = vLLM's fraction of the GPU"
    )
    preprocess: Literal["threads", "processes"] = Field(
        "threads", description="vLLM: where images become model inputs: the renderer's threads, or worker processes"
    )
    preprocess_workers: int = Field(0, ge=0, le=64, description="vLLM: image preprocessing threads or processes "
                                    "(0 = auto)")
    stream_interval: int = Field(
        4, ge=1, le=64, description="vLLM: tokens per streamed delta (the first token is sent at once)"
    )
    fast_pixels: bool = Field(True, description="vLLM: HunyuanOCR's image processor through hyocr's bit-identical "
                              "fast path (3x less CPU a card) instead of transformers' own")
    pixel_transfer: Literal["bytes", "floats"] = Field(
        "bytes", description="vLLM: how image patches travel to the engine core: bytes, normalised on the device "
        "by hyocr's encoder (half the bf16 copy on the core's thread; needs fast_pixels), or the processor's floats")
    vision_encoder: Literal["batched", "vllm"] = Field(
        "batched", description="vLLM <= 0.31: run the ViT once over all images of a pass (batched, self-tested "
        "at start) or image by image (vLLM's own)"
    )
    vllm_args: str | None = Field(None, description='vLLM: more AsyncEngineArgs as a JSON object, e.g. '
                                  '\'{"async_scheduling": false}\' (applied last)')
    speculative_config: str | None = Field(
        None, description='vLLM: speculative decoding as a JSON object, e.g. HunyuanOCR 1.5\'s DFlash draft: '
        '\'{"method": "dflash", "model": "/models/HunyuanOCR/dflash", "num_speculative_tokens": 15}\'')

    # --- remote upstream (--engine openai) ---
    upstream_url: str | None = Field(None, description="OpenAI-compatible base URL, e.g. http://gpu1:8000/v1")
    upstream_key: SecretStr | None = Field(None, description="bearer token for the upstream")
    upstream_timeout: float = Field(300.0, gt=0, le=3600, description="seconds per upstream request")
    upstream_retries: int = Field(2, ge=0, le=10, description="retries before any output (connect, 429/503)")

    # --- HunyuanOCR image bounds (model engines resize pages into these) ---
    min_pixels: int = Field(512 * 512, ge=1024)
    max_pixels: int = Field(2048 * 2048, ge=1024)

    # --- auth and limits (all off unless set) ---
    api_keys: SecretStr | None = Field(None, description="comma-separated API keys (Bearer or X-API-Key)")
    jwt_secret: SecretStr | None = Field(None, description="HS256 secret for JWT bearer tokens")
    jwt_public_key: str | None = Field(None, description="RS256 public key for JWTs: PEM text or a file path")
    jwt_jwks_file: str | None = Field(None, description="a JWKS file of RS256 public keys")
    jwt_audience: str | None = Field(None, description="required JWT aud")
    jwt_issuer: str | None = Field(None, description="required JWT iss")
    allowed_ips: str | None = Field(None, description="client IP allowlist, comma-separated CIDRs")
    trusted_proxies: str | None = Field(None, description="CIDRs whose X-Forwarded-For is believed")
    public_ready: bool = Field(True, description="/ready needs no credentials")
    public_metrics: bool = Field(False, description="/metrics needs no credentials")
    metrics_api_keys: SecretStr | None = Field(
        None, description="comma-separated keys of the metrics scrapers: /metrics answers only them (403 for "
        "other callers, who would see every tenant's volumes)")
    metrics_port: int | None = Field(None, ge=1, le=65535,
                                     description="also serve /metrics on this port (no auth: bind it privately)")
    metrics_host: str | None = Field(None, description="address the metrics port binds (default: host)")
    rate_limit: str | None = Field(None, description="per caller, e.g. 60/minute or 10/second;1000/hour")
    rate_limit_storage: str = Field("memory://", description="memory:// or redis://host:6379 (shared)")
    auth_failure_limit: str | None = Field(
        "30/minute", description="credentials that fail (401) per client address, then 429 for that address "
        "until the window frees (guessing slowed); counted in rate_limit_storage; 'off' turns it off")

    # --- image URLs (off unless an allowlist is set) ---
    allowed_media_domains: str | None = Field(
        None, description="hosts image URLs may be fetched from: example.com,*.cdn.example.com or *")
    media_fetch_allow_private: bool = Field(False, description="also allow private-network hosts (on-prem)")
    media_fetch_timeout: float = Field(10.0, gt=0, le=300, description="seconds per image fetch, redirects included")

    # --- admission and deadlines ---
    max_concurrency: int = Field(64, ge=1, le=100_000, description="requests in the engine at once")
    max_queue: int = Field(256, ge=0, le=1_000_000, description="requests waiting; beyond that, 503 at once")
    queue_timeout: float = Field(30.0, gt=0, le=3600,
                                 description="seconds a request may wait for an engine slot (then 503)")
    request_timeout: float = Field(300.0, gt=0, le=86_400, description="seconds per request; then 504")
    stall_timeout: float = Field(120.0, ge=0, le=86_400,
                                 description="no engine output for this long with requests in flight: restart it (0: off)")

    # --- generation defaults ---
    default_max_tokens: int = Field(4096, ge=1, le=131072)
    max_tokens_limit: int = Field(16384, ge=1, le=131072)
    prompt_language: Literal["zh", "en"] = "zh"
    loop_guard: bool = Field(True, description="stop generation when the output starts repeating")

    # --- media limits (enforced before decoding) ---
    max_body_bytes: int = Field(64 * 1024 * 1024, ge=1024)
    body_timeout: float = Field(60.0, gt=0, le=3600,
                                description="seconds a request body may take to arrive (then 408)")
    max_image_bytes: int = Field(20 * 1024 * 1024, ge=1024)
    max_image_pixels: int = Field(40_000_000, ge=1024, description="width*height from the header")
    max_images_per_request: int = Field(8, ge=1, le=1000)
    max_request_pixels: int = Field(160_000_000, ge=1024, description="width*height of all images of a request "
                                    "together, from their headers (PDFs: max_document_pixels)")
    decode_budget_mb: int = Field(0, ge=0, le=1_048_576, description="MiB that decoding full-size images may "
                                  "take at once, all requests together (0: 128 per CPU core, at least 256); an "
                                  "image waits for its share (at most queue_timeout, then 503); one that needs "
                                  "more than all of it decodes alone")
    image_formats: tuple[ImageFormat, ...] = ("PNG", "JPEG", "WEBP", "BMP", "TIFF")

    # PDF: documents are rendered page by page in worker processes (pipeline/pdf.py)
    max_pages: int = Field(64, ge=1, le=10_000, description="PDF pages per request (after a pages= selection)")
    max_pdf_bytes: int = Field(50 * 1024 * 1024, ge=1024, description="PDF size cap, checked before rendering")
    max_document_pixels: int = Field(320_000_000, ge=1_000_000, description="rendered pixels per PDF (all "
                                     "pages); pages past it are error pages (64 A4 pages for HunyuanOCR: 268 M)")
    pdf_workers: int = Field(2, ge=1, le=64, description="PDF render worker processes")
    pdf_render_timeout: float = Field(15.0, gt=0, le=3600, description="seconds to open a PDF or render one "
                                      "page; then the worker is killed and the request gets 422")
    pdf_worker_memory_mb: int = Field(1024, ge=0, le=1_048_576,
                                      description="address-space limit of a render worker, MiB (0: none)")
    pdf_max_dpi: int = Field(300, ge=36, le=1200, description="highest DPI a PDF page is rendered at")
    pdf_min_dpi: int = Field(36, ge=1, le=1200, description="a page that does not fit the pixel caps at "
                             "this DPI is refused (413)")
    pdf_detector_dpi: int = Field(150, ge=36, le=1200, description="DPI for engines that are not HunyuanOCR "
                                  "(rapidocr)")
    pdf_max_visual_tokens: int | None = Field(None, ge=64, description="HunyuanOCR engines: visual tokens a "
                                              "page may cost (default: those of a max_pixels square page)")

    # --- scale-out on Ray (extra ray): hyocr/ray/ ---
    ray: bool = Field(False, description="serve: a Ray Serve application (the API as ingress, the engine as "
                      "replicas); batch: a Ray Data pipeline (pages rendered in tasks, read by engine actors)")
    ray_address: str | None = Field(None, description="Ray cluster to join: auto, ray://HOST:10001; unset: "
                                    "RAY_ADDRESS, else a local cluster started here")
    ray_replicas: int = Field(1, ge=1, le=4096, description="Ray: engine replicas (serve) or engine actors "
                              "(batch); the minimum when autoscaling")
    ray_max_replicas: int | None = Field(None, ge=1, le=4096, description="Ray Serve: autoscale the engine "
                                         "between ray_replicas and this many replicas (unset: a fixed count)")
    ray_target_ongoing_requests: float | None = Field(
        None, gt=0, description="Ray Serve autoscaling: requests in flight a replica aims at (default: half "
        "max_concurrency)")
    ray_gpus_per_replica: float | None = Field(None, ge=0, le=64, description="Ray: GPUs per engine replica "
                                               "(default: tensor_parallel_size for vllm/transformers, 0 otherwise)")
    ray_cpus_per_replica: float = Field(1.0, ge=0, le=1024, description="Ray: CPUs per engine replica")

    # --- durable jobs (/v1/jobs), webhooks, the Batch API (/v1/files, /v1/batches), object storage ---
    jobs: bool = Field(True, description="serve the jobs API (/v1/jobs): documents read in the background")
    data_dir: str | None = Field(None, description="where the jobs database and the webhook secret live "
                                 "(default: $XDG_DATA_HOME/hyocr, else ~/.local/share/hyocr)")
    jobs_database_url: str | None = Field(
        None, description="jobs database (SQLAlchemy URL); default sqlite+aiosqlite:///DATA_DIR/jobs.db. "
        "postgresql+asyncpg://... (extra postgres) shares jobs between replicas")
    job_retention: float = Field(86_400.0, gt=0, le=365 * 86_400, description="seconds a finished job's result "
                                 "is kept (then deleted)")
    job_workers: int = Field(2, ge=1, le=1024, description="page ranges a server reads for jobs at once")
    job_range_pages: int = Field(8, ge=1, le=1000, description="pages of a job (or hyocr batch's PDF) per request")
    job_max_pages: int = Field(10_000, ge=1, le=1_000_000, description="pages per job (a PDF's selection)")
    job_max_running: int = Field(2, ge=1, le=10_000, description="jobs of one caller running at once")
    job_max_active: int = Field(1000, ge=1, le=10_000_000, description="jobs one caller may have queued or "
                                "running; a submit past it is a 429 with Retry-After")
    job_max_stored_bytes: int = Field(2 * 1024**3, ge=1, description="bytes of documents one caller's queued "
                                      "and running jobs may hold; a submit past it is a 429 with Retry-After")
    job_max_attempts: int = Field(3, ge=1, le=100, description="tries of a page range that failed retryably "
                                  "(engine restarting, overload); then its pages are error pages")
    job_lease: float = Field(30.0, ge=1, le=3600, description="seconds a replica's claim on a page range lasts "
                             "without renewal; a replica that died frees its ranges after this")
    job_online_reserve: float = Field(0.5, ge=0, le=1, description="share of MAX_CONCURRENCY kept for online "
                                      "requests: jobs start a range only while fewer are in flight")
    file_max_bytes: int = Field(200 * 1024**2, ge=1024, description="bytes of an upload (<= MAX_BODY_BYTES)")
    batch_max_lines: int = Field(50_000, ge=1, le=10_000_000, description="requests per batch input file")
    object_store_allowed_buckets: BucketList = Field(None, description="s3://bucket[/prefix/], gs://b, or *")
    object_store_endpoint: StoreEndpoint = Field(None, description="an S3-compatible http(s)://host:port")
    webhook_secret: SecretStr | None = Field(
        None, description="Standard Webhooks signing secret (whsec_<base64>); default: one generated and kept "
        "in DATA_DIR/webhook-secret")
    webhook_max_attempts: int = Field(8, ge=1, le=100, description="deliveries of a webhook before giving up")
    webhook_timeout: float = Field(10.0, gt=0, le=300, description="seconds per webhook delivery")
    webhook_concurrency: int = Field(64, ge=1, le=10_000, description="webhook deliveries in flight at once")
    webhook_host_concurrency: int = Field(4, ge=1, le=1000, description="webhook deliveries in flight to one "
                                          "receiver (host and port): a slow receiver delays only its own")

    @field_validator("image_formats", mode="before")
    @classmethod
    def _split_formats(cls, v: object) -> object:
        if isinstance(v, str):  # HYOCR_IMAGE_FORMATS=png,jpeg
            return tuple(s.strip().upper() for s in v.split(",") if s.strip())
        return v

    @field_validator("vllm_args", "speculative_config")
    @classmethod
    def _json_object(cls, v: str | None) -> str | None:
        if v is None:
            return v
        import json

        try:
            parsed = json.loads(v)
        except ValueError as exc:
            raise ValueError(f"not JSON: {exc}") from None
        if not isinstance(parsed, dict):
            raise ValueError("must be a JSON object of AsyncEngineArgs names and values")
        return v

    @field_validator("jobs_database_url")
    @classmethod
    def _async_driver(cls, v: str | None) -> str | None:
        """The async driver hyocr ships for each database: a plain postgresql:// or sqlite:// URL gets it."""
        if v is None:
            return v
        scheme, sep, rest = v.partition("://")
        drivers = {"postgresql": "postgresql+asyncpg", "postgres": "postgresql+asyncpg",
                   "postgresql+asyncpg": "postgresql+asyncpg", "sqlite": "sqlite+aiosqlite",
                   "sqlite+aiosqlite": "sqlite+aiosqlite"}
        if not sep or scheme not in drivers:
            raise ValueError("must be postgresql://USER@HOST/DB (extra postgres) or sqlite:///PATH")
        return f"{drivers[scheme]}://{rest}"

    @field_validator("max_tokens_limit")
    @classmethod
    def _limit_covers_default(cls, v: int, info) -> int:
        default = info.data.get("default_max_tokens")
        if default is not None and v < default:
            raise ValueError(f"must be >= default_max_tokens ({default})")
        return v

    @property
    def ray_gpus(self) -> float:
        """GPUs a Ray engine replica (or batch actor) asks for: the model engines one per tensor-parallel rank."""
        if self.ray_gpus_per_replica is not None:
            return self.ray_gpus_per_replica
        model = self.engine in ("vllm", "transformers")
        # ENGINES_PER_GPU on Ray: each replica is one core on that share of a GPU (engines/vllm/cores.py)
        return float(self.tensor_parallel_size * self.data_parallel_size) / self.engines_per_gpu if model else 0.0

    @property
    def data_path(self) -> Path:
        """DATA_DIR, or the user's data folder (created by whoever writes there)."""
        if self.data_dir:
            return Path(self.data_dir).expanduser()
        import os

        return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "hyocr"

    @property
    def workers(self) -> int:
        """Parallel CPU inferences: explicit, or one per two cores (ONNX Runtime threads inside each)."""
        if self.engine_workers:
            return self.engine_workers
        import os

        return max(1, (os.cpu_count() or 2) // 2)


class SettingsError(Exception):
    """Bad configuration, with one readable line per problem."""

    @classmethod
    def of(cls, problems: list[str]) -> SettingsError:
        """"invalid settings:" and each problem on a line of its own ("name (HYOCR_NAME): what is wrong")."""
        return cls("invalid settings:\n" + "\n".join(f"  {p}" for p in problems))


def load_settings(**overrides: object) -> Settings:
    """Build settings from the environment plus explicit overrides (``None`` overrides are ignored)."""
    given = {k: v for k, v in overrides.items() if v is not None}
    try:
        return Settings(**given)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            name = ".".join(str(p) for p in err["loc"])
            if not name:  # a rule across several settings (a model validator): no one variable or flag
                lines.append(err['msg'].removeprefix('Value error, '))
                continue
            env = f"HYOCR_{name.upper()}"
            lines.append(f"{name} ({env} / --{name.replace('_', '-')}): {err['msg']}")
        raise SettingsError.of(lines) from None
