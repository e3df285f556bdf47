"""Small time-series charts as inline SVG for the report: lines, interval bars, a shaded band, a threshold.

Hand-written SVG keeps the report free of plotting dependencies and makes it
one self-contained HTML file. Guarantees: every text is escaped; a chart
with no finite point renders a plain "no data" panel instead of an empty
frame; given a `period`, the time axis spans exactly that period (a week
with one day of data still shows the week), with one tick per day when it is
two days or longer; a band is drawn as one shaded block per span, so a band
of a single day is visible; the output is deterministic for the same input.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from html import escape

__all__ = ["BandSpan", "Series", "time_chart"]

WIDTH, HEIGHT = 720, 260
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 28, 44
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#17becf")


@dataclass(frozen=True, slots=True)
class Series:
    """One line: points (time, value), optional interval per point, optional highlighted points."""

    name: str
    times: Sequence[datetime]
    values: Sequence[float | None]
    lower: Sequence[float | None] | None = None
    upper: Sequence[float | None] | None = None
    highlight: Sequence[bool] = field(default_factory=tuple)


@dataclass(frozen=True, slots=True)
class BandSpan:
    """A band's limits over [start, end): drawn as one shaded block (a control band is a step per window)."""

    start: datetime
    end: datetime
    lower: float
    upper: float


def _finite(values: Sequence[float | None]) -> list[float]:
    return [v for v in values if v is not None and math.isfinite(v)]


def _ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step) + 1)]


def _label(value: float) -> str:
    return f"{value:.3g}" if abs(value) < 1e4 else f"{value:.2e}"


def _time_ticks(t0: float, t1: float) -> list[tuple[datetime, str]]:
    """Midnights (UTC) labelled by date over two days or more, else five even ticks labelled by time."""
    if t1 - t0 >= 2 * 86400:
        first = datetime.fromtimestamp(t0, UTC).replace(hour=0, minute=0, second=0, microsecond=0)
        if first.timestamp() < t0:
            first += timedelta(days=1)
        days = int((t1 - first.timestamp()) // 86400) + 1
        step = max(1, math.ceil(days / 10))  # at most about ten labels, so they never overlap
        midnights = [first + timedelta(days=i) for i in range(0, days, step)]
        return [(t, f"{t:%m-%d}") for t in midnights]
    ticks = [datetime.fromtimestamp(t0 + (t1 - t0) * i / 4, UTC) for i in range(5)]
    return [(t, t.strftime("%m-%d %H:%M")) for t in ticks]


def time_chart(
    title: str,
    series: Sequence[Series],
    *,
    y_label: str = "",
    band: Sequence[BandSpan] = (),
    band_label: str = "",
    period: tuple[datetime, datetime] | None = None,
    threshold: float | None = None,
    threshold_label: str = "",
    y_min: float | None = None,
    y_max: float | None = None,
) -> str:
    """An SVG chart of `series` over time (over `period` when given), with an optional shaded `band`."""
    points = [
        (t, v)
        for s in series
        for t, v in zip(s.times, s.values, strict=True)
        if v is not None and math.isfinite(v)
    ]
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" '
        f'height="{HEIGHT}" role="img" aria-label="{escape(title)}" font-family="sans-serif" font-size="11">'
        f'<text x="{LEFT}" y="16" font-size="13" font-weight="bold">{escape(title)}</text>'
    )
    if not points:
        return (
            head
            + f'<rect x="{LEFT}" y="{TOP}" width="{WIDTH - LEFT - RIGHT}" height="{HEIGHT - TOP - BOTTOM}" '
            f'fill="#f6f6f6" stroke="#ccc"/><text x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle" '
            f'fill="#666">no data in this window</text></svg>'
        )
    times = [t for t, _ in points] + [t for span in band for t in (span.start, span.end)]
    values = [v for _, v in points]
    for s in series:
        values += _finite(s.lower or []) + _finite(s.upper or [])
    values += _finite([v for span in band for v in (span.lower, span.upper)])
    if threshold is not None:
        values.append(threshold)
    t0, t1 = min(times).timestamp(), max(times).timestamp()
    if period is not None:
        t0, t1 = period[0].timestamp(), period[1].timestamp()
    if t1 <= t0:
        t0, t1 = t0 - 3600, t1 + 3600
    lo = min(values) if y_min is None else y_min
    hi = max(values) if y_max is None else y_max
    if hi <= lo:
        lo, hi = lo - 0.5 * (abs(lo) or 1), hi + 0.5 * (abs(hi) or 1)
    if y_max is None:
        # Headroom, so the highest point is not drawn on the frame.
        hi += 0.08 * (hi - lo)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(t: datetime) -> float:
        return LEFT + (t.timestamp() - t0) / (t1 - t0) * plot_w

    def y(v: float) -> float:
        return TOP + (1 - (v - lo) / (hi - lo)) * plot_h

    parts = [head]
    parts.append(
        f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="white" stroke="#999"/>'
    )
    for tick in _ticks(lo, hi):
        parts.append(
            f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y(tick):.1f}" y2="{y(tick):.1f}" stroke="#eee"/>'
            f'<text x="{LEFT - 4}" y="{y(tick) + 4:.1f}" text-anchor="end">{_label(tick)}</text>'
        )
    for at, text in _time_ticks(t0, t1):
        parts.append(
            f'<text x="{x(at):.1f}" y="{TOP + plot_h + 16}" text-anchor="middle">{escape(text)}</text>'
        )
    if y_label:
        parts.append(
            f'<text x="14" y="{TOP + plot_h / 2}" transform="rotate(-90 14 {TOP + plot_h / 2})" '
            f'text-anchor="middle">{escape(y_label)}</text>'
        )
    for span in band:
        left, right = max(LEFT, x(span.start)), min(LEFT + plot_w, x(span.end))
        top, bottom = y(min(hi, span.upper)), y(max(lo, span.lower))
        # A band of zero height (lower == upper) still shows as a line of 1 px.
        parts.append(
            f'<rect class="band" x="{left:.1f}" y="{top:.1f}" width="{max(0.0, right - left):.1f}" '
            f'height="{max(1.0, bottom - top):.1f}" fill="#2ca02c" fill-opacity="0.2" stroke="none"/>'
        )
    if band and band_label:
        parts.append(
            f'<text x="{LEFT + plot_w - 4}" y="{HEIGHT - 8}" text-anchor="end" fill="#2ca02c">'
            f"&#9632; {escape(band_label)}</text>"
        )
    if threshold is not None:
        parts.append(
            f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y(threshold):.1f}" y2="{y(threshold):.1f}" '
            f'stroke="#d62728" stroke-dasharray="4 3"/>'
            f'<text x="{LEFT + plot_w - 4}" y="{y(threshold) - 4:.1f}" '
            f'text-anchor="end" fill="#d62728">{escape(threshold_label)}</text>'
        )
    for index, s in enumerate(series):
        color = PALETTE[index % len(PALETTE)]
        drawn = [
            (x(t), y(v), i)
            for i, (t, v) in enumerate(zip(s.times, s.values, strict=True))
            if v is not None and math.isfinite(v)
        ]
        if len(drawn) > 1:
            path = " ".join(f"{px:.1f},{py:.1f}" for px, py, _ in drawn)
            parts.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="1.5"/>')
        for px, py, i in drawn:
            low = s.lower[i] if s.lower is not None else None
            high = s.upper[i] if s.upper is not None else None
            if low is not None and high is not None and math.isfinite(low) and math.isfinite(high):
                parts.append(
                    f'<line x1="{px:.1f}" x2="{px:.1f}" y1="{y(low):.1f}" y2="{y(high):.1f}" '
                    f'stroke="{color}"/>'
                )
            hot = i < len(s.highlight) and s.highlight[i]
            parts.append(
                f'<circle cx="{px:.1f}" cy="{py:.1f}" r="{4 if hot else 2.5}" '
                f'fill="{"#d62728" if hot else color}"/>'
            )
        parts.append(
            f'<text x="{LEFT + 8 + 150 * index}" y="{HEIGHT - 8}" fill="{color}">'
            f"&#9632; {escape(s.name)}</text>"
        )
    parts.append("</svg>")
    return "".join(parts)
