"""``hyocr batch`` on a 15 MB scan, in-process and through a server's jobs API (``--url``: the client uploads
it as multipart), each a real process with the real rapidocr engine; the output holds the scan's text."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import serve
from imaging import Line, render, squash, to_bytes

LINES = [Line("QUARTERLY REPORT 2024", (120, 150), 96), Line("TOTAL DUE 4,512.80 EUR", (120, 1050), 96)]


@pytest.fixture(scope="module")
def docs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("big") / "docs"
    root.mkdir()
    data = to_bytes(render(LINES, size=(2600, 1950)).image, "PNG", compress_level=0)  # 15.2 MB
    assert len(data) > 14.5e6
    (root / "scan.png").write_bytes(data)
    return root


def _batch(docs: Path, out: Path, *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "hyocr", "batch", str(docs), "--output", str(out), "--task",
                           "text", "--max-retries", "0", *args], capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr
    (output,) = [p for p in out.iterdir() if p.suffix == ".json" and p.name != "summary.json"]
    return squash(" ".join(page["text"] for page in json.loads(output.read_text())["pages"]))


@pytest.mark.parametrize("remote", [False, True], ids=["in-process", "url"])
def test_batch_reads_a_15_mb_scan(docs, tmp_path, remote):
    if not remote:
        text = _batch(docs, tmp_path / "out")
    else:
        server = serve(engine="rapidocr", ui=False)  # the default caps
        try:
            text = _batch(docs, tmp_path / "out", "--url", server.url, "--poll", "0.2")
        finally:
            server.stop()
    for line in LINES:
        assert squash(line.text) in text, text
