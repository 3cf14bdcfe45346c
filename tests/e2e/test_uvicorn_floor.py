"""hyocr's server on the oldest uvicorn its pin allows. vLLM's environments bring their own uvicorn (0.38 in the
GPU bundle), and hyocr reaches into uvicorn's server and HTTP protocols; a name imported from a newer uvicorn
(STARTUP_FAILURE) once stopped every ``hyocr serve`` there while CI, on the newest uvicorn, stayed green."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]


def _floor(package: str) -> str:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    for dep in deps:
        found = re.fullmatch(rf"{package}(\[[^\]]*\])?>=([\w.]+)(,.*)?", dep.replace(" ", ""))
        if found:
            return found.group(2)
    raise AssertionError(f"no floor for {package} in pyproject.toml")


def test_serve_and_its_port_handling_work_on_the_oldest_uvicorn_allowed(tmp_path):
    floor = _floor("uvicorn")
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site),
                    f"uvicorn=={floor}"], check=True, timeout=300)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    shown = subprocess.run([sys.executable, "-c", "import uvicorn; print(uvicorn.__version__)"], env=env,
                           capture_output=True, text=True, check=True)
    assert Version(shown.stdout.strip()) == Version(floor)
    # The tests of `hyocr serve` as a user runs it (the parser's JSON 400, the port taken before and while the
    # engine loads), of the port group and of an abandoned stream, in processes that import the old uvicorn first.
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
                          "tests/e2e/test_serve_http.py", "tests/unit/test_port_group.py",
                          # uvicorn 0.30-0.32.0 declared ASGI 2.4, and Starlette then never heard a streaming
                          # client leave: the floor is 0.32.1
                          "tests/integration/test_serving_errors.py::"
                          "test_a_stream_abandoned_by_its_client_is_a_499_like_a_plain_request"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert re.search(r"\b\d+ passed", run.stdout), run.stdout[-500:]
