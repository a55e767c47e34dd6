"""matplotlib for files only: one place that selects the Agg backend (no display needed), and one way to
write a figure (``save_figure``)."""

from __future__ import annotations

from pathlib import Path


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend, imported on first use (drawing modules call this inside
    their draw functions, so importing them does not import matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path, note: str | None = None, dpi: int = 110) -> Path:
    """Lay out, write (``dpi``, creating the folder) and close ``fig``; ``note`` goes small and grey in the
    bottom right corner. Returns ``path``."""
    if note:
        fig.text(0.99, 0.005, note, ha="right", va="bottom", fontsize=6, color="gray")
        fig.tight_layout(rect=(0, 0.02, 1, 1))
    else:
        fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
    return path
