"""Reports as a PNG (matplotlib, extra bench): the headline scores per run side by side, and pages/s."""

from __future__ import annotations

from typing import Any

from . import EvalError
from .report import HEADLINE

INSTALL_HINT = "plots need matplotlib: pip install 'hyocr[bench]'"


def require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise EvalError(INSTALL_HINT) from None


def plot(runs: list[tuple[str, dict[str, Any]]], path: str) -> None:
    """``runs``: (name, report) pairs. Left: each headline metric, a bar per run; right: pages/s."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed, none opened
    import matplotlib.pyplot as plt

    metrics = [(f, k, label, better) for f, k, label, better in HEADLINE
               if any(isinstance((doc["scores"].get(f) or {}).get(k), int | float) for _, doc in runs)]
    fig, (scores, speed) = plt.subplots(1, 2, figsize=(11, 4.5), layout="constrained",
                                        gridspec_kw={"width_ratios": [3, 1]})
    width = 0.8 / max(len(runs), 1)
    for i, (name, doc) in enumerate(runs):
        values = [(doc["scores"].get(f) or {}).get(k) or 0.0 for f, k, _, _ in metrics]
        scores.bar([x + i * width for x in range(len(metrics))], values, width, label=name)
        speed.bar([i], [doc["operational"].get("pages_per_s") or 0.0], 0.6, label=name)
    scores.set_xticks([x + width * (len(runs) - 1) / 2 for x in range(len(metrics))],
                      [f"{label}\n({better} better)" for _, _, label, better in metrics], rotation=30, ha="right",
                      fontsize=8)
    scores.set_title("scores")
    scores.grid(True, axis="y", alpha=0.3)
    scores.legend(fontsize=8)
    speed.set_xticks(range(len(runs)), [name for name, _ in runs], rotation=30, ha="right", fontsize=8)
    speed.set_title("pages/s")
    speed.grid(True, axis="y", alpha=0.3)
    try:
        fig.savefig(path, dpi=80)
    except OSError as exc:
        raise EvalError(f"{path}: {exc.strerror or exc}") from None
    finally:
        plt.close(fig)
