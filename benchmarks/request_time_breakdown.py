"""Where a card's time goes on a GPU: one hyocr server per target, the card workload at
concurrency 64, and while it runs, what each part of the system is doing.

    python benchmarks/request_time_breakdown.py OUT_DIR [targets...]     targets as in engines_gpu.py (default hyocr-vllm)

Per target: start the server, warm it up (64 requests at concurrency 64), then a measured level of
REQUESTS cards at concurrency 64 during which it samples
- CPU seconds per second of the API process, of vLLM's engine process and of the load generator
  (/proc; 1.0 = one core busy), and the busiest threads of the first two;
- vLLM's running and waiting requests and hyocr's in-flight count (the server's /metrics, 4 a second);
- GPU utilisation (nvidia-smi every 100 ms);
- the vision encoder's passes, images per pass, wall and GPU milliseconds per image (the engine
  process writes them: HYOCR_ENCODER_TIMING_FILE, engines/vllm/vision.py);
- the means of hyocr's and vLLM's latency histograms over the level (/metrics): where a request's time
  goes between the server, its stages and vLLM's queue, prefill and decode;
- with HYOCR_BENCH_PYSPY, a py-spy profile of the server processes (their busiest functions).
With API_PROCESSES > 1 ("+api4"), "api" is the first API process, "api_all" the CPU of all of them.
Writes OUT_DIR/diag-TARGET.json (+ the bench JSON, the server log, the raw profile) and prints a table.
"""

from __future__ import annotations

import collections
import json
import os
import re
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engines_gpu import ROOT, build_checkpoint, gpu_trace, safe, server_command, stop_server, wait_ready  # noqa: E402

REQUESTS = int(os.environ.get("HYOCR_DIAG_REQUESTS", "384"))
CONCURRENCY = os.environ.get("HYOCR_DIAG_CONCURRENCY", "64")
MAX_TOKENS = os.environ.get("HYOCR_BENCH_MAX_TOKENS", "150")
WORKLOAD = os.environ.get("HYOCR_DIAG_WORKLOAD", "card")  # or a4 (with HYOCR_BENCH_MAX_TOKENS=1000: a page)
PYSPY = os.environ.get("HYOCR_BENCH_PYSPY")
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int, tid: int | None = None) -> float:
    path = f"/proc/{pid}/task/{tid}/stat" if tid else f"/proc/{pid}/stat"
    try:
        fields = Path(path).read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime


def thread_names(pid: int) -> dict[int, str]:
    names = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            names[int(task.name)] = (task / "comm").read_text().strip()
        except OSError:
            pass
    return names


def children(pid: int) -> list[int]:
    kids = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            kids += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return kids


def engine_pid(server: int) -> int | None:
    """vLLM's engine-core process: the server's child whose command line says so, else its busiest child."""
    best = None
    for kid in children(server):
        try:
            cmd = Path(f"/proc/{kid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "EngineCore" in cmd or "engine" in cmd.lower():
            return kid
        if best is None or cpu_seconds(kid) > cpu_seconds(best):
            best = kid
    return best


def frontends(server: int, engine: int | None) -> list[int]:
    """The API processes: the server itself, or with API_PROCESSES > 1 its children other than the engine
    core (and multiprocessing's resource tracker)."""
    kids = []
    for kid in children(server):
        try:
            cmd = Path(f"/proc/{kid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if kid != engine and "resource_tracker" not in cmd:
            kids.append(kid)
    return kids or [server]


_HISTOGRAM = re.compile(r"^((?:vllm:|hyocr_)[a-z0-9_:]+)_(sum|count)(\{[^}]*\})? ([0-9.eE+-]+)$", re.M)


def histogram_totals(url: str) -> dict[str, float]:
    """Every histogram's _sum and _count on /metrics (summed over the series of one name, except
    hyocr's per-route and per-stage latencies, kept apart), for means over a measured interval."""
    totals: dict[str, float] = collections.defaultdict(float)
    text = httpx.get(url + "/metrics", timeout=10).text
    for name, part, labels, value in _HISTOGRAM.findall(text):
        keep = re.findall(r'(?:route|stage)="([^"]*)"', labels or "")
        totals[f"{name}{'[' + keep[0] + ']' if keep else ''}_{part}"] += float(value)
    return dict(totals)


def histogram_means(before: dict, after: dict, wall: float) -> dict:
    """Mean of each histogram over the interval (its unit: seconds, tokens), and its events per second."""
    out = {}
    for key in sorted(after):
        if not key.endswith("_count"):
            continue
        base = key[:-len("_count")]
        count = after[key] - before.get(key, 0)
        if count <= 0:
            continue
        total = after.get(base + "_sum", 0) - before.get(base + "_sum", 0)
        out[base] = {"per_s": round(count / wall, 2), "mean": round(total / count, 4)}
    return out


class Sampler(threading.Thread):
    """Polls /metrics for vLLM's running/waiting and hyocr's in-flight requests."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.stop, self.rows = url, threading.Event(), []

    def run(self) -> None:
        pattern = re.compile(r"^(vllm:num_requests_running|vllm:num_requests_waiting|hyocr_requests_in_flight)"
                             r"(?:\{[^}]*\})? ([0-9.eE+-]+)$", re.M)
        with httpx.Client(timeout=2) as client:
            while not self.stop.wait(0.25):
                try:
                    text = client.get(self.url + "/metrics").text
                except httpx.HTTPError:
                    continue
                row = collections.defaultdict(float)
                for name, value in pattern.findall(text):
                    row[name] += float(value)
                self.rows.append(dict(row))

    def means(self) -> dict:
        keys = {k for r in self.rows for k in r}
        return {k: round(sum(r.get(k, 0) for r in self.rows) / max(1, len(self.rows)), 1) for k in sorted(keys)}


def gpu_utilisation(path: Path) -> float | None:
    values = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            values.append(float(line.split(",")[1]))
        except (IndexError, ValueError):
            pass
    return round(sum(values) / len(values), 1) if values else None


def pyspy_summary(path: Path, roles: dict[int, str], top: int = 22) -> dict:
    """Busiest functions per role (``roles``: pid -> role; processes of one role are counted together) from
    a raw (collapsed) py-spy profile: inclusive samples of each frame, and the share of samples per thread."""
    out: dict = {}
    if not path.exists():
        return out
    by_process: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    leaves: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    threads: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    totals: collections.Counter = collections.Counter()
    names = {str(pid): role for pid, role in roles.items()}
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        role = "other"
        # process PID:"command line" frames (parent, then child; command lines may hold ';')
        while match := re.match(r'process (\d+):"[^"]*";', stack):
            role = names.get(match.group(1), f"pid {match.group(1)}")
            stack = stack[match.end():]
        frames = stack.split(";")
        thread = frames.pop(0).split(": ", 1)[-1] if frames and frames[0].startswith("thread") else "?"
        n = int(count)
        totals[role] += n
        threads[role][thread] += n
        frames = [re.sub(r":\d+\)$", ")", f) for f in frames]
        for frame in set(frames):  # inclusive: once per stack
            by_process[role][frame] += n
        if frames:
            leaves[role][frames[-1]] += n
    for role, counter in by_process.items():
        out[role] = {"samples": totals[role],
                     "threads": {t: round(c / totals[role], 3) for t, c in threads[role].most_common(5)},
                     # inclusive shares, without the frames every stack goes through (bootstrap, loops)
                     "top": [(f, round(c / totals[role], 3)) for f, c in counter.most_common()
                             if c < 0.9 * totals[role]][:top],
                     "self": [(f, round(c / totals[role], 3)) for f, c in leaves[role].most_common(8)]}
    return out


def run_target(target: str, out: Path) -> dict:
    port = 8100
    url = f"http://127.0.0.1:{port}"
    name = safe(target)
    timing_file = out / f"{name}.encoder.json"
    env = {**os.environ, "HYOCR_UI": "false", "HYOCR_PUBLIC_METRICS": "true",
           "HYOCR_ENCODER_TIMING_FILE": str(timing_file),
           "PYTHONPATH": f"{ROOT / 'src'}:{os.environ.get('PYTHONPATH', '')}"}
    if target.startswith("hyocr"):  # the device bundle's install.sh forces V1 (for `vllm serve`); hyocr picks its own
        env.pop("VLLM_USE_V2_MODEL_RUNNER", None)
    log = open(out / f"{name}.server.log", "w")
    proc = subprocess.Popen(server_command(target, port), stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    result: dict = {"target": target}
    try:
        result["ready_s"] = round(wait_ready(url, proc), 1)
        bench = [sys.executable, "-m", "hyocr", "bench", "--url", url, "--workload", WORKLOAD, "--concurrency", CONCURRENCY,
                 "--max-tokens", MAX_TOKENS, "--fixed-output", "--label", target, "--warmup", "0"]
        subprocess.run([*bench, "--requests", CONCURRENCY], env=env, check=False, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        engine = engine_pid(proc.pid)
        apis = frontends(proc.pid, engine)
        # with several API processes: the first one's threads, all of their CPU (api_all), the parent's
        api_roles = ["api", *(f"api{i}" for i in range(2, len(apis) + 1))]
        pids = {**dict(zip(api_roles, apis)), "engine": engine}
        if apis != [proc.pid]:
            pids["parent"] = proc.pid
        before_threads = {role: {tid: cpu_seconds(pid, tid) for tid in thread_names(pid)}
                          for role, pid in pids.items() if pid and role in ("api", "engine")}
        before = {role: cpu_seconds(pid) for role, pid in pids.items() if pid}
        hist_before = histogram_totals(url)
        encoder_before = json.loads(timing_file.read_text()) if timing_file.exists() else {}
        sampler = Sampler(url)
        sampler.start()
        spy = None
        if PYSPY:
            spy = subprocess.Popen([PYSPY, "record", "--pid", str(proc.pid), "--subprocesses", "--nonblocking",
                                    "--threads", "-r", "100", "-d", "12", "-f", "raw", "-o",
                                    str(out / f"{name}.diag-pyspy.txt")],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        usage_before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.monotonic()
        with gpu_trace(out / f"{name}.diag-gpu.csv", interval_ms=100):
            subprocess.run([*bench, "--requests", str(REQUESTS), "--output", str(out / f"diag-{WORKLOAD}-{name}.json")],
                           env=env, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wall = time.monotonic() - started
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        sampler.stop.set()
        time.sleep(1.2)  # the engine process writes its encoder timing once a second
        encoder_after = json.loads(timing_file.read_text()) if timing_file.exists() else {}
        result["cpu_per_s"] = {role: round((cpu_seconds(pid) - before[role]) / wall, 2)
                               for role, pid in pids.items() if pid}
        result["api_processes"] = len(apis)
        result["cpu_per_s"]["api_all"] = round(sum(result["cpu_per_s"][role] for role in api_roles), 2)
        # where a request's time goes: hyocr's route/stage latencies and vLLM's queue/prefill/decode/e2e
        result["histograms"] = histogram_means(hist_before, histogram_totals(url), wall)
        result["cpu_per_s"]["bench_client"] = round(
            (usage.ru_utime + usage.ru_stime - usage_before.ru_utime - usage_before.ru_stime) / wall, 2)
        result["busiest_threads"] = {}
        for role, pid in pids.items():
            if not pid or role not in before_threads:
                continue
            names = thread_names(pid)
            busy = sorted(((cpu_seconds(pid, tid) - before_threads[role].get(tid, 0)) / wall, names[tid])
                          for tid in names)[-4:]
            result["busiest_threads"][role] = [(n, round(b, 2)) for b, n in reversed(busy)]
        result["queues_mean"] = sampler.means()
        result["gpu_util_mean_pct"] = gpu_utilisation(out / f"{name}.diag-gpu.csv")
        if encoder_after and encoder_before:
            d = {k: encoder_after[k] - encoder_before.get(k, 0) for k in ("passes", "images", "patches", "wall_s",
                                                                            "gpu_s")}
            span = encoder_after["time"] - encoder_before["time"]
            result["encoder"] = {
                "mode": encoder_after.get("mode"), "images_per_pass": round(d["images"] / max(1, d["passes"]), 2),
                "wall_ms_per_image": round(1000 * d["wall_s"] / max(1, d["images"]), 2),
                "gpu_ms_per_image": round(1000 * d["gpu_s"] / max(1, d["images"]), 2),
                "wall_share": round(d["wall_s"] / span, 3) if span > 0 else None}
            if "batch_passes" in encoder_after:  # the core batching byte pixels (engines/vllm/staging.py)
                b = {k: encoder_after[k] - encoder_before.get(k, 0) for k in ("batch_passes", "batch_bytes", "batch_s")}
                result["encoder"].update(
                    batch_ms_per_pass=round(1000 * b["batch_s"] / max(1, b["batch_passes"]), 2),
                    batch_mb_per_pass=round(b["batch_bytes"] / 2**20 / max(1, b["batch_passes"]), 1),
                    batch_share=round(b["batch_s"] / span, 3) if span > 0 else None)
        doc = json.loads((out / f"diag-{WORKLOAD}-{name}.json").read_text())
        level = doc["levels"][-1]
        result["bench"] = {k: level[k] for k in ("throughput_rps", "latency_p50_s", "latency_p99_s", "ttft_p50_s",
                                                 "errors")}
        if spy is not None:
            spy.wait(timeout=60)
            roles = {proc.pid: "parent", **{pid: "api" for pid in apis}}  # one API process: it is the parent
            if engine:
                # the engine core's executor workers, where the model runs in processes of their own
                roles.update({engine: "engine", **{pid: "engine worker" for pid in children(engine)}})
            result["pyspy"] = pyspy_summary(out / f"{name}.diag-pyspy.txt", roles)
    finally:
        stop_server(proc)
        log.close()
    (out / f"diag-{name}{'' if WORKLOAD == 'card' else '-' + WORKLOAD}.json").write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    return result


def main() -> int:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    build_checkpoint()
    for target in sys.argv[2:] or ["hyocr-vllm"]:
        try:
            r = run_target(target, out)
        except Exception as exc:  # keep going: one broken target must not lose the others' numbers
            print(f"{target}: FAILED: {exc!r}", flush=True)
            continue
        print(json.dumps({k: v for k, v in r.items() if k != "pyspy"}, ensure_ascii=False), flush=True)
        for role, summary in r.get("pyspy", {}).items():
            print(f"  pyspy {role}: {summary['samples']} samples, threads {summary['threads']}", flush=True)
            for frame, share in summary["top"]:
                print(f"    {share:5.3f} {frame}", flush=True)
            print("   self:", "; ".join(f"{share:.3f} {frame}" for frame, share in summary["self"]), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
