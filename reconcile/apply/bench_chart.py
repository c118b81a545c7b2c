"""The bench figures across generations as one self-contained SVG (no script, no external reference):
decode and concurrent aggregate tok/s, and TTFT, per generation. Written beside the records by
reconcile.apply.benchmark.keep; pure (imports nothing of ours)."""

from __future__ import annotations

from html import escape

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

W, H, LEFT, RIGHT, TOP, PANEL, GAP, INSET = 760, 520, 70, 20, 70, 160, 80, 50
SERIES = (  # (key in the headline, label, colour, panel)
    ("decode_tok_s", "decode tok/s (long generation)", "#1f77b4", 0),
    ("aggregate_tok_s", "concurrent aggregate tok/s", "#2ca02c", 0),
    ("ttft_s", "TTFT s (largest prompt)", "#d62728", 1),
)


def headline(run: dict[str, Any]) -> dict[str, float | None]:
    """TTFT of the largest single-stream prompt, decode tok/s of the long generation, aggregate tok/s."""
    rows = run.get("rows") or []
    singles = [r for r in rows if r.get("concurrency", 1) == 1]
    many = [r for r in rows if r.get("concurrency", 1) > 1]
    longest = max(singles, key=lambda r: r.get("prompt", 0), default=None)
    long_gen = max(singles, key=lambda r: r.get("gen", 0), default=None)
    return {
        "ttft_s": longest["figures"]["ttft_s"] if longest else None,
        "decode_tok_s": long_gen["figures"]["decode_tok_s"] if long_gen else None,
        "aggregate_tok_s": max((r["figures"].get("aggregate_tok_s", 0.0) for r in many), default=None),
    }


def render(by_generation: dict[int, dict[str, Any]]) -> str:
    """The SVG text: one point per generation (its newest run), x in generation order."""
    gens = sorted(by_generation)
    heads = {g: headline(by_generation[g]) for g in gens}
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
        'font-family="sans-serif" font-size="12">',
        '<rect width="100%" height="100%" fill="white"/>',
        f'<text x="{LEFT}" y="22" font-size="15">reconcile bench: figures per generation</text>',
    ]
    width = W - LEFT - RIGHT
    span = width - 2 * INSET  # points stay clear of the frame, their labels inside it
    step = span / max(1, len(gens) - 1)
    for panel, title in ((0, "tokens per second (higher is better)"), (1, "seconds (lower is better)")):
        top = TOP + panel * (PANEL + GAP)
        keys = [s for s in SERIES if s[3] == panel]
        values = [v for g in gens for k, *_ in keys if (v := heads[g].get(k)) is not None]
        peak = max(values, default=1.0) * 1.15 or 1.0
        out.append(f'<text x="{LEFT}" y="{top - 6}" fill="#444">{escape(title)}</text>')
        out.append(f'<rect x="{LEFT}" y="{top}" width="{width}" height="{PANEL}" fill="none" stroke="#999"/>')
        for frac in (0.0, 0.5, 1.0):
            y = top + PANEL - frac * PANEL
            out.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{peak * frac:.3g}</text>')
        for n, g in enumerate(gens):
            x = LEFT + INSET + (n * step if len(gens) > 1 else span / 2)
            out.append(f'<text x="{x:.1f}" y="{top + PANEL + 16}" text-anchor="middle">gen {g}</text>')
        for k, label, colour, _ in keys:
            points = []
            for n, g in enumerate(gens):
                v = heads[g].get(k)
                if v is None:
                    continue
                x = LEFT + INSET + (n * step if len(gens) > 1 else span / 2)
                y = top + PANEL - (v / peak) * PANEL
                points.append((x, y, v))
            if len(points) > 1:
                path = " ".join(f"{x:.1f},{y:.1f}" for x, y, _ in points)
                out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"/>')
            for x, y, v in points:
                out.append(
                    f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3.5" fill="{colour}"><title>'
                    f"{escape(label)}: {v:.4g}</title></circle>"
                )
                out.append(f'<text x="{x + 5:.1f}" y="{y - 6:.1f}" fill="{colour}">{v:.3g}</text>')
        for i, (_k, label, colour, _) in enumerate(keys):
            lx = LEFT + 10 + i * 280  # the legend under the panel's generation labels
            ly = top + PANEL + 34
            out.append(f'<rect x="{lx}" y="{ly - 5}" width="12" height="3" fill="{colour}"/>')
            out.append(f'<text x="{lx + 16}" y="{ly}">{escape(label)}</text>')
    if not gens:
        out.append(f'<text x="{LEFT}" y="{TOP + 40}">no generation measured yet</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
