"""The error histograms of `vmprof model evaluate` (paper 003, figures 1 and 2): text and PNG.

The terminal plot is a few lines of bars written here (rich and textual draw no histograms);
the PNG is matplotlib's, drawn off-screen (Agg).
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from vmprof_tui import files

BAR = 30  # characters of the longest bar


def bin_edges(errors: dict[str, np.ndarray], bins: int = 12) -> np.ndarray:
    """Common bins of the absolute errors of every model, in % of one core."""
    top = max(float(np.abs(e).max()) for e in errors.values()) * 100
    return np.linspace(0.0, max(top, 1e-9), bins + 1)


def text(errors: dict[str, np.ndarray], summaries: dict[str, dict], unit: str = "% of a core") -> str:
    """One row per bin: the share of points of each model whose |error| falls in it."""
    edges = bin_edges(errors)
    counts = {name: np.histogram(np.abs(e) * 100, edges)[0] for name, e in errors.items()}
    n = {name: len(e) for name, e in errors.items()}
    width = max(len(name) for name in errors)
    lines = [f"|error| ({unit})   " + "   ".join(f"{name:<{BAR + 6}}" for name in errors)]
    for b in range(len(edges) - 1):
        cells = []
        for name in errors:
            share = counts[name][b] / max(n[name], 1)
            cells.append(f"{'█' * round(share * BAR):<{BAR}} {share * 100:4.0f}%")
        lines.append(f"{edges[b]:6.1f} – {edges[b + 1]:6.1f}      " + "   ".join(cells))
    lines.append("")
    for name, s in summaries.items():
        lines.append(f"{name:<{width}}  points {s['n']}, |error| median {s['median'] * 100:.1f}, "
                     f"90th percentile {s['p90'] * 100:.1f}, mean {s['mean'] * 100:.1f}, max {s['max'] * 100:.1f}"
                     f" ({unit})")
    return "\n".join(lines) + "\n"


def png(errors: dict[str, np.ndarray], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    edges = bin_edges(errors, bins=20)
    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    for name, e in errors.items():
        ax.hist(np.abs(e) * 100, bins=edges, alpha=0.55, label=f"{name} (n={len(e)})")
    ax.set_xlabel("|predicted − measured| (% of one core)")
    ax.set_ylabel("evaluation points")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    files.write_file(path, buf.getvalue())
