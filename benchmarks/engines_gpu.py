"""The engines benchmark on a GPU machine: raw `vllm serve` vs hyocr's vLLM engine vs hyocr's
transformers engine, on the full-size HunyuanOCR 1.0 architecture with random weights, the same
seeded card workload and the same client (``hyocr bench``), one target at a time.

    python benchmarks/engines_gpu.py OUT_DIR [targets...]     targets: vllm-serve hyocr-vllm hyocr-transformers,
                                                               or hyocr-vllm+NAME (a variant in VARIANTS)

Environment: HYOCR_BENCH_WORKLOAD (card,page: each on the same server start), HYOCR_BENCH_CONCURRENCY,
HYOCR_BENCH_MAX_TOKENS, HYOCR_BENCH_SERVER_ARGS, HYOCR_BENCH_PYSPY (a py-spy binary: a profile of each server).
Beside each bench JSON, WORKLOAD-TARGET.gpu.csv traces GPU utilisation and memory every 250 ms.

Each target: start the server, wait until ready, run `hyocr bench`, stop it. Results (the bench JSON per
target, plus the server log) go to OUT_DIR. Random weights never emit EOS usefully, so every request
generates exactly --max-tokens (ignore_eos), as in the reference measurements (DEVICE.md).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
CHECKPOINT = Path(os.environ.get("HYOCR_BENCH_CHECKPOINT", "/tmp/hunyuanocr-1.0-random"))
CONCURRENCY = os.environ.get("HYOCR_BENCH_CONCURRENCY", "1,8,32,64")
WORKLOADS = os.environ.get("HYOCR_BENCH_WORKLOAD", "card").split(",")  # each one run on the same server start
# Named hyocr-vllm configurations, to measure one change at a time against the shipped defaults.
VARIANTS = {
    "vllm-defaults": "--expected-tokens 0 --max-num-batched-tokens 2048 --preprocess-workers 1",
    "1-worker": "--preprocess-workers 1",
    "bt16k": "--max-num-batched-tokens 16384",
    "stream1": "--stream-interval 1",
    "stream4": "--stream-interval 4",
    "seqs128": "--max-num-seqs 128 --max-concurrency 128",
    "kv850": "--expected-tokens 850",
    "kv1024": "--expected-tokens 1024",  # the default before issue 18 (KV for 64 cards, not pages)
    "mem": "--expected-tokens 850 --max-num-batched-tokens 4096",  # toward the 10 GB target
    "processes": "--preprocess processes",
    "vllm-vit": "--vision-encoder vllm",  # vLLM's image-by-image encoder (hyocr's default: batched)
    "hf-pixels": "--no-fast-pixels",  # transformers' image processor (hyocr's default: its fast path)
    "session1": "--vision-encoder vllm --no-fast-pixels --stream-interval 1",  # per-image ViT, HF pixels, a delta per token
    "noasync": '--vllm-args {"async_scheduling":false}',
    "kvfraction": "--expected-tokens 0",  # vLLM's KV sizing (92% of the GPU), all else hyocr's
    "gil1ms": "--gil-switch-interval 0.001",
    "api2": "--api-processes 2",  # HTTP server processes sharing one engine core
    "api4": "--api-processes 4",
    "fp8kv": "--kv-cache-dtype fp8",  # half the KV bytes a decode step reads (session 23: -8% GPU time a card)
    # 1.5's DFlash draft, random weights (benchmarks/dflash_draft.py; gpu_runs.sh dflash builds it): the cost of
    # speculation that is always wrong, and that the output is unchanged
    # vLLM data parallelism: two engine cores (on one GPU only if vLLM places both there; issue 21 measures 2-8)
    "dp2": "--data-parallel-size 2",
    # Ray Serve: the API as the Serve ingress, the engine as one GPU replica (the cost of the Ray hop)
    "ray1": "--ray --ray-replicas 1",
    "dflash": '--speculative-config {"method":"dflash","model":"/tmp/dflash-random","num_speculative_tokens":15}',
}
# Output tokens a request: "150" for every workload, or per workload, e.g. "card=150 a4=1000" (a document
# page writes ~1000, issue 18's page workload).
_MAX = os.environ.get("HYOCR_BENCH_MAX_TOKENS", "150")
MAX_TOKENS = dict(item.split("=", 1) for item in _MAX.split() if "=" in item) if "=" in _MAX else {"": _MAX}
PYSPY = os.environ.get("HYOCR_BENCH_PYSPY")  # path of a py-spy binary: profile each server
PROBE = os.environ.get("HYOCR_BENCH_PROBE")  # set: record greedy texts (benchmarks/output_probe.py) per target
# Requests per level for a workload, e.g. "a4=32,32,64,128" (an A4 page takes ~4x a card): hyocr bench's
# default (4 per stream) otherwise. benchmarks/raw_vllm.py takes the same --requests.
REQUESTS = dict(item.split("=", 1) for item in os.environ.get("HYOCR_BENCH_REQUESTS", "").split() if "=" in item)


def build_checkpoint() -> None:
    if (CHECKPOINT / "model.safetensors").exists():
        return
    sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
    from tiny_hunyuan import HUNYUANOCR_1_0_SIZES, build_tiny_checkpoint

    started = time.time()
    build_tiny_checkpoint(CHECKPOINT, sizes=HUNYUANOCR_1_0_SIZES, remote_code=False)
    print(f"built the full-size random checkpoint in {time.time() - started:.0f}s", flush=True)


def server_command(target: str, port: int) -> list[str]:
    py = sys.executable
    if target == "vllm-serve":
        # The official HunyuanOCR 1.0 serve line (its README), everything else at vLLM's defaults, plus the one
        # workaround vLLM 0.26 needs (serve_chat_template).
        return [py, "-m", "vllm.entrypoints.openai.api_server", "--model", str(CHECKPOINT), "--port", str(port),
                "--host", "127.0.0.1", "--served-model-name", "raw-vllm", "--no-enable-prefix-caching",
                "--mm-processor-cache-gb", "0", "--gpu-memory-utilization", "0.2",
                "--chat-template", str(serve_chat_template())]
    base, _, variant = target.partition("+")
    engine = {"hyocr-vllm": "vllm", "hyocr-transformers": "transformers"}.get(base)
    if engine is None or variant not in VARIANTS and variant:  # a typo must not measure another engine
        raise ValueError(f"unknown target {target!r}")
    cmd = [py, "-m", "hyocr", "serve", "--engine", engine, "--model", str(CHECKPOINT), "--port", str(port),
           "--served-model-name", target, "--log-level", "warning", *VARIANTS.get(variant, "").split()]
    if engine == "transformers":
        cmd += ["--max-num-seqs", "64", "--batch-wait-ms", "20"]
    return cmd + os.environ.get("HYOCR_BENCH_SERVER_ARGS", "").split()


def serve_chat_template() -> Path:
    """The checkpoint's chat template with each image as the bare image placeholder. vLLM 0.26's HunYuanVL
    prompt update matches that token alone and writes the start/end wrappers around it itself, so the
    official template's start+image+end gave two starts and an IndexError in XD-RoPE (fixed upstream in
    vLLM PR #49691, after 0.26). The token ids are then exactly those of HunyuanOCR's own processor, and
    what hyocr's engine and raw_vllm.py send."""
    start, image, end = (f"<\uff5chy_place\u2581holder\u2581no\u2581{n}\uff5c>" for n in (100, 102, 101))
    template = (CHECKPOINT / "chat_template.jinja").read_text()
    assert start + image + end in template, "the checkpoint's template does not wrap images as expected"
    path = CHECKPOINT.parent / "vllm-serve-chat-template.jinja"
    path.write_text(template.replace(start + image + end, image))
    return path


def wait_ready(url: str, proc: subprocess.Popen, timeout: float = 600) -> float:
    started = time.time()
    while time.time() - started < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        for path in ("/ready", "/health"):
            try:
                if httpx.get(url + path, timeout=2).status_code == 200 and (
                    path == "/ready" or "hyocr" not in " ".join(proc.args)
                ):
                    return time.time() - started
            except httpx.HTTPError:
                pass
        time.sleep(1)
    raise RuntimeError("server not ready in time")


def safe(target: str) -> str:
    """File names without '+', which the GPU machine's file transfer refuses."""
    return target.replace("+", "--")


@contextlib.contextmanager
def gpu_trace(path: Path, interval_ms: int = 250):
    """GPU utilisation and memory every ``interval_ms`` while the block runs (is the GPU the limit?)."""
    if not shutil.which("nvidia-smi"):
        yield
        return
    with open(path, "w") as f:
        smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,utilization.gpu,memory.used",
                                "--format=csv,noheader,nounits", "-lms", str(interval_ms)], stdout=f)
        try:
            yield
        finally:
            smi.terminate()
            smi.wait(timeout=10)


def port_free(port: int) -> bool:
    """Nothing listens there. A server left over from an interrupted run would otherwise answer /ready
    and be measured in the new target's name."""
    import socket

    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


def run_target(target: str, out: Path) -> None:
    port = 8100
    url = f"http://127.0.0.1:{port}"
    if not port_free(port):
        raise RuntimeError(f"port {port} is taken (a server left from an earlier run?)")
    log = open(out / f"{safe(target)}.server.log", "w")
    env = {**os.environ, "HYOCR_UI": "false", "PYTHONPATH": f"{ROOT / 'src'}:{os.environ.get('PYTHONPATH', '')}"}
    command = server_command(target, port)
    if PYSPY:  # a profile of the server process (its event loop and threads) for the whole run
        command = [PYSPY, "record", "-r", "50", "-f", "raw", "-o", str(out / f"{safe(target)}.pyspy.txt"), "--",
                   *command]
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        ready = wait_ready(url, proc)
        print(f"{target}: ready in {ready:.0f}s", flush=True)
        # The transformers engine at concurrency 1 takes ~4 s a request: fewer requests, every level full,
        # two a stream from 32 up (one a stream measures a single wave, not the steady state).
        levels = [int(c) for c in CONCURRENCY.split(",")]
        fewer = ",".join(str(max(16, 2 * c)) for c in levels)
        for workload in WORKLOADS:
            requests = ["--requests", fewer] if target == "hyocr-transformers" else []
            if workload in REQUESTS:
                requests = ["--requests", REQUESTS[workload]]
            bench = [sys.executable, "-m", "hyocr", "bench", "--url", url, "--workload", workload,
                     "--concurrency", CONCURRENCY, "--max-tokens", MAX_TOKENS.get(workload, MAX_TOKENS.get("", "150")),
                     "--fixed-output",
                     "--label", target, "--output", str(out / f"{workload}-{safe(target)}.json"), *requests]
            before = preemptions(url)
            with gpu_trace(out / f"{workload}-{safe(target)}.gpu.csv"):
                done = subprocess.run(bench, check=False, env=env, stderr=subprocess.DEVNULL)
            during = None if before is None or (after := preemptions(url)) is None else after - before
            (out / f"{workload}-{safe(target)}.preemptions.txt").write_text(f"{during}\n")
            print(f"{target} {workload}: bench exit {done.returncode}, preemptions {during}", flush=True)
        if PROBE:
            probe = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "output_probe.py"), url,
                                    str(out / f"{safe(target)}.outputs.json")], check=False, env=env)
            print(f"{target}: output probe exit {probe.returncode}", flush=True)
    finally:
        stop_server(proc)
        log.close()


def preemptions(url: str) -> float | None:
    """vLLM's preemption counter from the server's /metrics (None: not exported, e.g. not a vLLM server)."""
    with contextlib.suppress(httpx.HTTPError):
        for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
            if line.startswith("vllm:num_preemptions_total"):
                return float(line.rsplit(" ", 1)[1])
    return None


def stop_server(proc: subprocess.Popen) -> None:
    """SIGTERM to the server's process group (its engine processes too), SIGKILL after 60 s."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # it had already exited (its log says why)
        pass


def main() -> int:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    targets = sys.argv[2:] or ["vllm-serve", "hyocr-vllm", "hyocr-transformers"]
    build_checkpoint()
    # `timeout` sends SIGTERM: unwind through run_target's finally, which stops the server it started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))
    for target in targets:
        try:
            run_target(target, out)
        except Exception as exc:  # keep going: one broken target must not lose the others' numbers
            print(f"{target}: FAILED: {exc}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
