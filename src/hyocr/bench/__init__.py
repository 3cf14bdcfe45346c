"""Benchmark harness: ``hyocr bench`` (load generator, seeded workloads, JSON + markdown + plot reports)
and ``hyocr bench compare`` (runs side by side, with ratios to the first)."""


class BenchError(Exception):
    """A problem the user can fix (bad flag, unreadable file, missing extra): one line, exit status 2."""
