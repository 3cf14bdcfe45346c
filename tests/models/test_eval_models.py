"""``hyocr eval --url`` against the HunyuanOCR engines (transformers, vLLM) on the tiny random-weight
checkpoint: a report of the right shape (scores per family, tokens per page, finish reasons, the engine and
model named). Random weights write noise, so the values mean nothing and are not checked."""

from __future__ import annotations

import json
import subprocess
import sys

from imaging import card


def test_the_tiny_checkpoint_engines_produce_a_report(model_server, tmp_path):
    card().image.save(tmp_path / "card.png")
    lines = [{"path": "card.png", "task": "text", "truth": {"text": "IDENTITY CARD\nNAME: JOHN SMITH"}},
             {"path": "card.png", "truth": {"fields": {"name": "JOHN SMITH"}},
              "schema": {"type": "object", "properties": {"name": {"type": "string"}}}}]
    (tmp_path / "set.jsonl").write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    out = tmp_path / "report.json"
    done = subprocess.run([sys.executable, "-m", "hyocr", "eval", str(tmp_path / "set.jsonl"), "--output", str(out),
                           "--url", model_server.url, "--max-tokens", "8", "--poll", "0.2"],
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode in (0, 1), done.stderr  # 1: the noise was not JSON, a failed extraction page
    assert "Traceback" not in done.stderr
    report = json.loads(out.read_text())
    meta, ops = report["metadata"], report["operational"]
    assert meta["engine"]["engine"] == model_server.engine.info.name
    assert meta["engine"]["model"] == "hunyuanocr-tiny" and meta["set"]["tasks"] == {"text": 1, "extract": 1}
    assert set(report["scores"]) == {"text", "extraction"}
    assert report["scores"]["text"]["pages"] == 1 and report["scores"]["extraction"]["fields"] == 1
    assert report["scores"]["extraction"]["schema_valid_rate"] in (0.0, 1.0)
    assert ops["documents"]["done"] == 2 and ops["pages"]["read"] == 2
    assert sum(ops["finish_reasons"].values()) == 2 and ops["tokens_per_page"]["completion"] > 0
    assert 0 < ops["tokens_per_page"]["completion"] <= 8
