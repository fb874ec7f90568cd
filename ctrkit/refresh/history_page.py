"""The page a person looks at: a refreshed model's history (``history.jsonl``) as one self-contained HTML file, a
chart of the served model's AUC on each new day before training on it and of the gate's scores, and a row a day
(the checks, the scores, calibration, the verdict and why)."""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ctrkit.data.atomic import atomic_file

PAGE = "history.html"
COLORS = {"progressive": "#1f77b4", "served": "#7f7f7f", "candidate": "#2ca02c"}


def _figure(record: dict[str, Any], *keys: str) -> float | None:
    value: Any = record
    for k in keys:
        value = value.get(k) if isinstance(value, dict) else None
    return float(value) if isinstance(value, (int, float)) else None


def _chart(records: Sequence[dict[str, Any]], width: int = 720, height: int = 220) -> str:
    """An SVG line chart: per day, the served model's AUC on the day before training (progressive), and the gate's
    served and candidate AUC on the held-out rows."""
    series = {
        "progressive": [(r["day"], _figure(r, "progressive", "auc")) for r in records],
        "served": [(r["day"], _figure(r, "gate", "served", "auc")) for r in records],
        "candidate": [(r["day"], _figure(r, "gate", "candidate", "auc")) for r in records],
    }
    values = [v for points in series.values() for _, v in points if v is not None]
    days = [r["day"] for r in records if isinstance(r.get("day"), int)]
    if not values or not days:
        return "<p>No scores yet: the first day has no served model to score it.</p>"
    lo, hi = min(values) - 0.005, max(values) + 0.005
    d0, d1 = min(days), max(max(days), min(days) + 1)
    x = lambda d: 50 + (d - d0) / (d1 - d0) * (width - 70)  # noqa: E731
    y = lambda v: 10 + (hi - v) / (hi - lo) * (height - 40)  # noqa: E731
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
             'aria-label="AUC by day">']  # fmt: skip
    for v in (lo, (lo + hi) / 2, hi):
        parts.append(f'<text x="4" y="{y(v) + 4:.1f}" font-size="11">{v:.3f}</text>')
        parts.append(f'<line x1="50" x2="{width - 20}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#ddd"/>')
    for d in sorted(set(days)):
        parts.append(f'<text x="{x(d) - 4:.1f}" y="{height - 8}" font-size="11">{d}</text>')
    for name, points in series.items():
        pts = [(x(d), y(v)) for d, v in points if v is not None]
        if len(pts) > 1:
            path = " ".join(f"{a:.1f},{b:.1f}" for a, b in pts)
            parts.append(f'<polyline fill="none" stroke="{COLORS[name]}" stroke-width="2" points="{path}"/>')
        for a, b in pts:
            parts.append(f'<circle cx="{a:.1f}" cy="{b:.1f}" r="3" fill="{COLORS[name]}"/>')
    parts.append("</svg>")
    legend = " ".join(f'<span style="color:{c}">&#9679; {n}</span>' for n, c in COLORS.items())
    return (
        "".join(parts) + f"<p>{legend}: the served model on the new day before training on it (progressive); "
        "the served model and the candidate on the day's held-out rows (the gate).</p>"
    )


def _cell(value: float | None, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _candidates(record: dict[str, Any]) -> str:
    """The candidate the day took, and each candidate's AUC on the held-out rows where it had two."""
    figures = record.get("candidates")
    if not figures:
        return "continued" if record.get("gate") else "-"
    said = ", ".join(f"{html.escape(n)} {_cell(f.get('auc'))}" for n, f in figures.items())
    return f"{html.escape(str(record.get('candidate')))} ({said})"


def render(records: Sequence[dict[str, Any]], name: str) -> str:
    """The page's HTML for ``records`` (``history.jsonl``'s, oldest first) of model ``name``."""
    rows = []
    for r in records:
        failed = [c for c in r.get("checks", []) if not c.get("passed")]
        checks = f"{len(r.get('checks', [])) - len(failed)}/{len(r.get('checks', []))} passed"
        if failed:
            checks += ": " + "; ".join(html.escape(str(c["name"])) for c in failed[:3])
        versions = f"{r.get('served_before', '-')} &rarr; {r.get('served_after', r.get('version', '-'))}"
        rows.append(
            "<tr>"
            f"<td>{r.get('day', '-')}</td><td>{html.escape(str(r.get('started', '')))}</td>"
            f'<td class="{html.escape(str(r.get("verdict", "")).replace(" ", "-"))}">'
            f"{html.escape(str(r.get('verdict', '')))}</td>"
            f"<td>{_cell(_figure(r, 'progressive', 'auc'))}</td><td>{_cell(_figure(r, 'progressive', 'logloss'))}</td>"
            f"<td>{_cell(_figure(r, 'gate', 'served', 'auc'))}</td>"
            f"<td>{_cell(_figure(r, 'gate', 'candidate', 'auc'))}</td><td>{_candidates(r)}</td>"
            f"<td>{_cell(_figure(r, 'holdout', 'calibration'), 3)}</td>"
            f"<td>{checks}</td><td>{versions}</td><td>{_cell(_figure(r, 'seconds'), 1)}</td>"
            f"<td>{html.escape(str(r.get('reason', '')))}</td>"
            "</tr>"
        )
    head = ("<tr><th>day</th><th>started</th><th>verdict</th><th>progressive AUC</th><th>progressive log loss</th>"
            "<th>served AUC (held out)</th><th>candidate AUC (held out)</th><th>candidate taken</th>"
            "<th>calibration</th><th>checks</th>"
            "<th>versions</th><th>seconds</th><th>why</th></tr>")  # fmt: skip
    title = f"ctrkit refresh: {html.escape(name)}"
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{title}</title><style>'
        "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;"
        "padding:3px 6px;font-size:13px;text-align:left}.published{color:#2ca02c}.kept{color:#ff7f0e}"
        ".refused{color:#d62728}</style></head><body>"
        f"<h1>{title}</h1><p>{len(records)} day(s).</p>{_chart(records)}"
        f'<table id="days">{head}{"".join(rows)}</table></body></html>\n'
    )


def write_page(store) -> Path:
    """Writes ``history.html`` beside ``store``'s history (``store.RefreshStore``), atomically; returns its path."""
    path = store.root / PAGE
    with atomic_file(path) as tmp:
        tmp.write_text(render(store.history(), store.name), encoding="utf-8")
    return path
