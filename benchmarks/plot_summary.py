"""The README's benchmark figure, drawn from the tables of BENCHMARKS.md.

``python -m benchmarks.plot_summary [BENCHMARKS.md] [--out docs/benchmarks.png]``

Reads the "Gaussian kernel product, D = ..." tables that ``python -m benchmarks.bench
--write FILE`` prints (times of lazytensor, dense torch and pykeops per N = M) and plots
billions of pairs per second against N, one panel per D. Skipped cells (over budget) are
left out; nothing is measured here.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

_TITLE = re.compile(r"^### Gaussian kernel product, D = (\d+), float32")
_TIME = re.compile(r"([\d.]+) (ms|s|µs) \(([\d.]+) G/s\)")


def tables(text: str) -> dict:
    """{D: {contender: [(N, G pairs/s), ...]}} from the bench's markdown."""
    out, D, header = {}, None, None
    for line in text.splitlines():
        m = _TITLE.match(line)
        if m:
            D, header = int(m.group(1)), None
            out[D] = {}
            continue
        if line.startswith("#"):
            D = None
        if D is None or not line.startswith("|") or line.startswith("|---"):
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if header is None:
            header = cells
            continue
        n = int(cells[0].replace(",", ""))
        for name, cell in zip(header[1:], cells[1:]):
            t = _TIME.search(cell)
            if t and ("over budget" not in cell):
                who = name.split(" (")[0]
                out[D].setdefault(who, []).append((n, float(t.group(3))))
    return out


def main(argv: list | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source", nargs="?", default="BENCHMARKS.md")
    ap.add_argument("--out", default="docs/benchmarks.png")
    args = ap.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = tables(Path(args.source).read_text())
    fig, axes = plt.subplots(1, len(data), figsize=(4 * len(data), 3.4), sharey=True)
    style = {"lazytensor": ("C0", "o-"), "torch dense": ("C1", "s-"), "pykeops": ("C3", "^-"),
             "roofline loop": ("0.5", ":"), "expert loop": ("0.5", ":")}
    for ax, (D, series) in zip(axes, sorted(data.items())):
        for who, pts in series.items():
            color, fmt = style.get(who, (None, "o-"))
            n, g = zip(*pts)
            ax.loglog(n, g, fmt, color=color, label=who)
        ax.set(title=f"Gaussian kernel product, D = {D}", xlabel="N = M")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("billion pairs / s (2 CPU cores)")
    handles = {h.get_label(): h for ax in axes for h in ax.get_lines()}
    fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=len(handles),
               fontsize=8, frameon=False)
    fig.subplots_adjust(bottom=0.25)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(args.out, dpi=90)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
