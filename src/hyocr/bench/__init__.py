"""Benchmark harness: ``hyocr bench`` (load generator, seeded workloads, JSON + markdown reports)."""
