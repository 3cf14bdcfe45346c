"""``--table jsonl|parquet``: the corpus as one table, a row a page of every document done (this run's and
earlier runs'), written from the outputs at the end of a run: ``pages.jsonl`` or ``pages.parquet`` beside
them (in DIR, or below the output prefix: outputs.py).

JSONL keeps a page's blocks and fields as they are in its document's output; Parquet has one schema for
every row, so there they are JSON text (``json.loads`` them), as the fields differ from task to task."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..jobs.codec import json_text
from .jsontext import readable


if TYPE_CHECKING:
    from .outputs import Output

FORMATS = ("jsonl", "parquet")
ROWS_PER_GROUP = 4096  # Parquet row groups: a few thousand pages at a time in memory
COLUMNS = (("document", "string"), ("output", "string"), ("page", "int32"), ("width", "int32"),
           ("height", "int32"), ("text", "string"), ("finish_reason", "string"), ("error", "string"),
           ("dpi", "int32"), ("source", "string"), ("markdown", "string"), ("blocks", "string"),
           ("fields", "string"))


def require(fmt: str | None) -> None:
    """Before the run: the format's writer is there."""
    if fmt == "parquet":
        try:
            import pyarrow.parquet  # noqa: F401
        except ImportError as exc:  # absent, or present and refusing to load (pyarrow 26 with numpy 1.x)
            raise RuntimeError(f'--table parquet needs pyarrow: pip install pyarrow (or "hyocr[ray]"): {exc}'
                               ) from None


CONTENT_TYPES = {"jsonl": "application/x-ndjson", "parquet": "application/vnd.apache.parquet"}


def write_table(output: Output, summary: Mapping[str, Any], fmt: str) -> str:
    """The table of the summary's done documents, written whole; where it was written. Raises OutputError
    when the store refuses it (or an output to read it from)."""
    rows = page_rows(output, summary["items"])
    writer = _write_parquet if fmt == "parquet" else _write_jsonl
    return output.write_file(f"pages.{fmt}", lambda path: writer(path, rows), CONTENT_TYPES[fmt])


def page_rows(output: Output, items: list[Mapping[str, Any]]) -> Iterator[dict[str, Any]]:
    done = [item for item in items if item["status"] == "done"]
    for item, body in zip(done, output.bodies(item["output"] for item in done), strict=True):
        for page in body.get("pages") or []:
            yield {"document": readable(item["path"]), "output": item["output"],  # a name not UTF-8: shown
                   "page": page.get("index"),
                   **{k: page.get(k) for k, _ in COLUMNS[3:-2]},
                   "blocks": page.get("blocks") or [], "fields": page.get("fields")}


def _write_jsonl(path: Path, rows: Iterator[dict[str, Any]]) -> None:
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json_text(row) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _write_parquet(path: Path, rows: Iterator[dict[str, Any]]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([(name, getattr(pa, kind)()) for name, kind in COLUMNS])
    with pq.ParquetWriter(path, schema) as writer:
        group: list[dict[str, Any]] = []
        for row in rows:
            group.append({**row, "blocks": json.dumps(row["blocks"], ensure_ascii=False),
                          "fields": None if row["fields"] is None else json.dumps(row["fields"], ensure_ascii=False)})
            if len(group) == ROWS_PER_GROUP:
                writer.write_table(pa.Table.from_pylist(group, schema))
                group = []
        writer.write_table(pa.Table.from_pylist(group, schema))
