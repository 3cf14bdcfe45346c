"""The jobs database: SQLAlchemy Core tables, the same on SQLite and PostgreSQL.

A job's pages are cut into ranges at submission; a range is claimed by a replica with a lease (a
conditional UPDATE, so two replicas never hold one range), and each page's result is a row keyed by
(job, position): storing a page twice is a no-op, so a range run again after a crash skips what is stored
and never counts a page twice.

The OpenAI Batch API lives beside the jobs: uploaded files (bytes in parts, so a download streams and
replicas on one database share them), batches, their lines and the chunks of lines claimed like ranges. A
line's answer is written once (``status_code`` set from NULL by a conditional UPDATE), so a chunk run again
after a crash answers only the lines still open.

Columns added after a table first shipped are nullable and listed in ADDED, so that ``upgrade`` can add them
to a database an older hyocr created (``create_all`` makes missing tables, never missing columns).
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    UniqueConstraint,
)

metadata = MetaData()

jobs = Table(
    "hyocr_jobs", metadata,
    Column("id", String(64), primary_key=True),
    Column("owner", String(256), nullable=False),
    Column("idempotency_key", String(256)),
    Column("request_digest", String(64)),  # codec.request_digest: what a reused Idempotency-Key must match
    Column("status", String(16), nullable=False),  # queued | running | succeeded | failed | cancelled
    Column("created_at", Float, nullable=False),
    Column("started_at", Float),
    Column("finished_at", Float),
    Column("expires_at", Float),
    Column("call", JSON, nullable=False),  # codec.call_to_json: the OcrCall without its media
    Column("pdf", Integer, nullable=False),  # 1: one PDF (item 0); 0: images
    Column("pages_total", Integer, nullable=False),
    Column("task", String(32), nullable=False),
    Column("requested_task", String(32), nullable=False),
    Column("model", String(256), nullable=False),
    Column("engine", String(64), nullable=False),
    Column("error", JSON),  # {"message", "type", "code"} when failed
    Column("callback_url", String(2048)),
    Column("callback_headers", JSON),
    # output_uri: where the result is written when the job ends (jobs/exports.py); output_state pending |
    # writing | written | failed, output_lease_until the writer's claim, output_error why it failed
    Column("output_uri", String(2048)),
    Column("output_state", String(16)),
    Column("output_lease_until", Float),
    Column("output_error", String(1024)),
    UniqueConstraint("owner", "idempotency_key", name="hyocr_jobs_idempotency"),
    Index("hyocr_jobs_owner_created", "owner", "created_at"),
    Index("hyocr_jobs_status", "status", "created_at"),
)

inputs = Table(
    "hyocr_job_inputs", metadata,
    Column("job_id", String(64), ForeignKey("hyocr_jobs.id", ondelete="CASCADE"), primary_key=True),
    Column("n", Integer, primary_key=True),
    Column("param", String(64), nullable=False),
    Column("data", LargeBinary, nullable=False),
)

ranges = Table(
    "hyocr_job_ranges", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_id", String(64), ForeignKey("hyocr_jobs.id", ondelete="CASCADE"), nullable=False),
    Column("positions", JSON, nullable=False),  # the job positions it reads, in order
    Column("items", JSON, nullable=False),  # per position: the PDF's page index (0-based), or the input n
    Column("state", String(16), nullable=False),  # pending | running | done
    Column("attempts", Integer, nullable=False, default=0),
    Column("lease_until", Float),
    Column("claimed_by", String(64)),
    Column("not_before", Float, nullable=False, default=0.0),
    Index("hyocr_job_ranges_state", "state", "job_id"),
)

pages = Table(
    "hyocr_job_pages", metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),  # the order pages were stored in
    Column("job_id", String(64), ForeignKey("hyocr_jobs.id", ondelete="CASCADE"), nullable=False),
    Column("position", Integer, nullable=False),
    Column("failed", Integer, nullable=False),
    Column("result", JSON, nullable=False),  # codec.page_to_json
    UniqueConstraint("job_id", "position", name="hyocr_job_pages_once"),
)

deliveries = Table(
    "hyocr_webhook_deliveries", metadata,
    Column("id", String(96), primary_key=True),  # the webhook-id: the same on every retry
    Column("job_id", String(64), nullable=False),
    Column("url", String(2048), nullable=False),
    Column("headers", JSON),
    Column("body", LargeBinary, nullable=False),
    Column("attempt", Integer, nullable=False, default=0),
    Column("next_at", Float, nullable=False),
    Column("state", String(16), nullable=False),  # pending | delivered | failed
    Column("last_status", Integer),
    Column("last_error", String(1024)),
    Index("hyocr_webhook_deliveries_due", "state", "next_at"),
)


files = Table(
    "hyocr_files", metadata,
    Column("id", String(64), primary_key=True),
    Column("owner", String(256), nullable=False),
    Column("filename", String(512), nullable=False),
    Column("purpose", String(32), nullable=False),  # batch (uploads) | batch_output (a batch's results)
    Column("bytes", BigInteger, nullable=False),
    Column("lines", Integer),  # purpose batch: the non-blank lines, counted at upload (the batch cap)
    Column("created_at", Float, nullable=False),
    Column("expires_at", Float),
    Column("complete", Integer, nullable=False),  # 0 while its parts are being written
    Index("hyocr_files_owner_created", "owner", "created_at"),
    Index("hyocr_files_expires", "expires_at"),
)

file_parts = Table(
    "hyocr_file_parts", metadata,
    Column("file_id", String(64), ForeignKey("hyocr_files.id", ondelete="CASCADE"), primary_key=True),
    Column("n", Integer, primary_key=True),
    Column("data", LargeBinary, nullable=False),
)

batches = Table(
    "hyocr_batches", metadata,
    Column("id", String(64), primary_key=True),
    Column("owner", String(256), nullable=False),
    # validating | failed | in_progress | finalizing | completed | expired | cancelling | cancelled
    Column("status", String(16), nullable=False),
    Column("ending", String(16)),  # finalizing, cancelling: the status it ends in (completed, expired, ...)
    Column("endpoint", String(64), nullable=False),
    Column("input_file_id", String(2048), nullable=False),  # a file id, or an object URI (s3://, gs://)
    Column("completion_window", String(8), nullable=False),
    Column("metadata", JSON),
    Column("errors", JSON),  # OpenAI's errors.data: [{code, message, line, param}] when validation failed
    Column("output_file_id", String(64)),
    Column("error_file_id", String(64)),
    Column("output_uri", String(2048)),
    Column("output_expires_after", Integer),  # seconds the output files are kept (default JOB_RETENTION)
    Column("export", JSON),  # output_uri's outcome: {status, written, failed, error}
    Column("total", Integer, nullable=False, default=0),
    Column("created_at", Float, nullable=False),
    Column("in_progress_at", Float),
    Column("expires_at", Float, nullable=False),  # created_at + the completion window
    Column("finalizing_at", Float),
    Column("completed_at", Float),
    Column("failed_at", Float),
    Column("expired_at", Float),
    Column("cancelling_at", Float),
    Column("cancelled_at", Float),
    Column("retain_until", Float),  # ended: deleted with its lines after JOB_RETENTION
    # a replica validating or finalizing it holds it this long (a dead one's claim runs out)
    Column("lease_until", Float),
    Column("claimed_by", String(64)),
    Index("hyocr_batches_owner_created", "owner", "created_at"),
    Index("hyocr_batches_status", "status", "created_at"),
)

batch_lines = Table(
    "hyocr_batch_lines", metadata,
    Column("batch_id", String(64), ForeignKey("hyocr_batches.id", ondelete="CASCADE"), primary_key=True),
    Column("n", Integer, primary_key=True),  # the line's number in the input file (1-based)
    Column("custom_id", String(512)),
    Column("request", LargeBinary),  # the line's body (JSON), dropped once answered
    Column("status_code", Integer),  # NULL: not answered yet; set once
    Column("answer", JSON),  # the output line ({id, custom_id, response, error})
    Column("prompt_tokens", Integer),
    Column("completion_tokens", Integer),
    Index("hyocr_batch_lines_open", "batch_id", "status_code"),
)

batch_chunks = Table(
    "hyocr_batch_chunks", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("batch_id", String(64), ForeignKey("hyocr_batches.id", ondelete="CASCADE"), nullable=False),
    Column("first", Integer, nullable=False),  # the line numbers it covers, first..last
    Column("last", Integer, nullable=False),
    Column("state", String(16), nullable=False),  # pending | running | done
    Column("attempts", Integer, nullable=False, default=0),
    Column("lease_until", Float),
    Column("claimed_by", String(64)),
    Column("not_before", Float, nullable=False, default=0.0),
    Index("hyocr_batch_chunks_state", "state", "batch_id"),
)


# (table, column) pairs added to tables after they first shipped: upgrade() adds them where missing.
ADDED = ((jobs, "request_digest"), (jobs, "output_uri"), (jobs, "output_state"), (jobs, "output_lease_until"),
         (jobs, "output_error"))


def upgrade(connection) -> None:
    """Add the ADDED columns an existing database lacks (a synchronous connection, inside a transaction)."""
    from sqlalchemy import inspect
    from sqlalchemy.schema import CreateColumn

    present = {t.name: {c["name"] for c in inspect(connection).get_columns(t.name)} for t, _ in ADDED}
    for table, name in ADDED:
        if name not in present[table.name]:
            column = CreateColumn(table.c[name]).compile(dialect=connection.dialect)
            connection.exec_driver_sql(f"ALTER TABLE {table.name} ADD COLUMN {column}")
