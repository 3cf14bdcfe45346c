"""Throughput and p99 latency against concurrency, one line per run, as a PNG (matplotlib, extra bench)."""

from __future__ import annotations

from . import BenchError

INSTALL_HINT = "plots need matplotlib: pip install 'hyocr[bench]'"


def require_matplotlib() -> None:
    """Checked before a run starts, so a missing extra does not cost a finished benchmark."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise BenchError(INSTALL_HINT) from None


def plot(runs: list[tuple[str, dict]], path: str) -> None:
    """``runs``: (name, result document) pairs. Two panels side by side, concurrency on a log2 axis."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed, none opened
    import matplotlib.pyplot as plt

    fig, (rps, p99) = plt.subplots(1, 2, figsize=(10, 4), layout="constrained")
    levels = sorted({lv["concurrency"] for _, doc in runs for lv in doc["levels"]})
    for name, doc in runs:
        ordered = sorted(doc["levels"], key=lambda lv: lv["concurrency"])
        xs = [lv["concurrency"] for lv in ordered]
        rps.plot(xs, [lv["throughput_rps"] for lv in ordered], marker="o", label=name)
        p99.plot(xs, [lv["latency_p99_s"] for lv in ordered], marker="o", label=name)
    for ax, title in ((rps, "throughput (req/s)"), (p99, "p99 latency (s)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(levels, [str(c) for c in levels])
        ax.minorticks_off()
        ax.set_xlabel("concurrency")
        ax.set_title(title)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
    rps.legend()
    try:
        fig.savefig(path, dpi=80)
    except OSError as exc:
        raise BenchError(f"{path}: {exc.strerror or exc}") from None
    finally:
        plt.close(fig)
