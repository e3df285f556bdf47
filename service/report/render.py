"""The report (`weekly.py`) written out: a Markdown summary and one self-contained HTML file.

Every number is printed with its denominator and its 95 % interval (`fmt`); a
period or panel without data says so in words. Text that came from traces
(app names, queries, releases) is escaped in both, so it shows and never runs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime
from html import escape

from service.report.faithfulness import faithfulness_lines
from service.report.svg_chart import BandSpan, Series, time_chart
from service.report.weekly import EMBEDDING_DETECTORS, AppReport, Interval, Report, minute_utc

__all__ = ["fmt", "render_html", "render_markdown"]


def fmt(interval: Interval, unit: str = "", digits: int = 3, scale: float = 1.0) -> str:
    """ "1.234 s (95 % CI 1.1–1.3)", or "no data"."""
    if interval is None:
        return "no data"
    est, low, high = (v * scale for v in interval)
    return f"{est:.{digits}g}{unit} (95 % CI {low:.{digits}g}–{high:.{digits}g}{unit})"


def _pct(interval: Interval) -> str:
    return fmt(interval, " %", 3, 100.0)


def _count(n: int, noun: str, plural: str | None = None) -> str:
    """`n` and the noun, singular for one: "1 answer", "2 answers", "0 answers"."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def _headline(app: AppReport, alpha: float) -> list[str]:
    alarms = [r for r in app.drift_runs if r.alarm]
    total = app.stages["total"]
    lines = [
        f"traces: {app.traces}",
        f"p50 total latency: {fmt(total[1], ' s')}, n = {total[0]}",
        f"p95 total latency: {fmt(total[2], ' s')}, n = {total[0]}",
        f"cost per query: {fmt(app.cost, ' USD')}, over {_count(app.priced, 'priced trace')}"
        f" ({app.unpriced} with an unpriced model call or one without token counts)",
        f"regeneration rate: {_pct(app.regeneration)}, {app.regenerations} of {_count(app.traces, 'trace')}",
        *(
            faithfulness_lines(app.faithfulness_section)
            if app.faithfulness_section is not None
            else [
                "faithfulness (share of claims supported): "
                + (
                    f"{fmt(app.faithfulness)}, n = {app.judged} judged (Hájek, weighted by inclusion "
                    f"probability; not in it: {_count(app.judge_failed, 'judge failure')}, "
                    f"{_count(app.no_claims, 'answer')} without claims)"
                    if app.faithfulness is not None
                    else f"no judgments in this period ({_count(app.judge_failed, 'judge failure')})"
                )
            ]
        ),
        f"drift: {_count(len(alarms), 'alarm')} in {_count(len(app.drift_runs), 'detector run')}"
        + (f" ({', '.join(sorted({r.result.detector for r in alarms}))})" if alarms else "")
        + f", each test at alpha = {alpha:g}",
    ]
    return lines


def _md(text: str) -> str:
    """Text from traces (app names, queries, releases) as Markdown that shows it, never renders it:
    Markdown passes raw HTML through, so `<`, `>` and `&` become entities."""
    return escape(text, quote=False)


def render_markdown(report: Report) -> str:
    """The summary: headline numbers per app, each with its denominator and interval. Every text
    that came from traces is escaped (`_md`)."""
    out = [
        f"# ragmon report: {minute_utc(report.since)} to {minute_utc(report.until)}",
        "",
        f"Tenant `{_md(report.tenant)}`, generated {minute_utc(report.generated_at)}.",
        "",
    ]
    if not report.apps:
        out.append(
            f"**No traces in this window** ({minute_utc(report.since)} to {minute_utc(report.until)}): "
            "there is nothing to report."
        )
        return "\n".join(out) + "\n"
    for app in report.apps:
        out += [f"## {_md(app.app)}", ""]
        out += [f"- {_md(line)}" for line in _headline(app, report.alpha)]
        out.append("")
        if app.groups:
            out += ["New query groups (share of queries now vs in the reference):", ""]
            for g in app.groups:
                out.append(
                    f"- {_md(', '.join(g['terms'])) or '(no distinctive words)'}: "
                    f"{100 * g['share_window']:.1f} % now ({g['n_window']} queries) vs "
                    f"{100 * g['share_reference']:.1f} % before ({g['n_reference']}), "
                    f"p = {g['p_value']:.2g}; "
                    f"e.g. {_md('; '.join(repr(e) for e in g['examples'][:3]))}"
                )
            out.append("")
        elif app.groups_note:
            out += [_md(app.groups_note), ""]
    return "\n".join(out) + "\n"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _mid(interval: Interval) -> float | None:
    return None if interval is None else interval[0]


def _lo(interval: Interval) -> float | None:
    return None if interval is None else interval[1]


def _hi(interval: Interval) -> float | None:
    return None if interval is None else interval[2]


def _app_html(app: AppReport, alpha: float, period: tuple[datetime, datetime]) -> str:
    times = [d.middle for d in app.days]
    parts = [f"<h2>{escape(app.app)}</h2><ul>"]
    parts += [f"<li>{escape(line)}</li>" for line in _headline(app, alpha)]
    parts.append("</ul>")

    embedding_runs = sorted(
        (
            r
            for r in app.drift_runs
            if r.result.detector in EMBEDDING_DETECTORS and r.outcome != "insufficient_data"
        ),
        key=lambda r: r.ran_at,
    )
    parts.append(
        time_chart(
            "Query drift over time (query-embedding MMD test per run)",
            [
                Series(
                    "-log10 p-value (red: alarm)",
                    [r.ran_at for r in embedding_runs],
                    [-math.log10(max(r.result.p_value or 1.0, 1e-6)) for r in embedding_runs],
                    highlight=[r.alarm for r in embedding_runs],
                )
            ],
            y_label="-log10 p",
            threshold=-math.log10(alpha),
            threshold_label=f"alpha = {alpha:g}",
            y_min=0.0,
            period=period,
        )
    )
    if not embedding_runs:
        parts.append(
            "<p>No query-embedding drift run in this period (no reference pinned, or no runs yet).</p>"
        )
    parts.append(
        time_chart(
            "Faithfulness estimate per day (judge-only Hájek, 95 % CI)",
            [
                Series(
                    "faithfulness",
                    times,
                    [_mid(d.faithfulness) for d in app.days],
                    [_lo(d.faithfulness) for d in app.days],
                    [_hi(d.faithfulness) for d in app.days],
                )
            ],
            y_label="faithfulness",
            y_min=0.0,
            y_max=1.0,
            period=period,
        )
    )
    band = [BandSpan(d.start, d.end, d.band[0], d.band[1]) for d in app.days if d.band is not None]
    parts.append(
        time_chart(
            "Regeneration rate per day (Wilson 95 % CI) and the regeneration detector's control band"
            if band
            else "Regeneration rate per day (Wilson 95 % CI); no control band in this period (see below)",
            [
                Series(
                    "regeneration rate",
                    times,
                    [_mid(d.regeneration) for d in app.days],
                    [_lo(d.regeneration) for d in app.days],
                    [_hi(d.regeneration) for d in app.days],
                    highlight=[
                        d.band is not None
                        and d.regeneration is not None
                        and not d.band[0] <= d.regeneration[0] <= d.band[1]
                        for d in app.days
                    ],
                )
            ],
            band=band,
            band_label="control band (exact binomial at the detector's baseline)",
            y_label="share of traces",
            y_min=0.0,
            period=period,
        )
    )
    if app.band_note:
        parts.append(f"<p>{escape(app.band_note)}</p>")
    parts.append(
        time_chart(
            "Total latency per day: p50 and p95 (95 % CI)",
            [
                Series(
                    "p50",
                    times,
                    [_mid(d.p50_total) for d in app.days],
                    [_lo(d.p50_total) for d in app.days],
                    [_hi(d.p50_total) for d in app.days],
                ),
                Series(
                    "p95",
                    times,
                    [_mid(d.p95_total) for d in app.days],
                    [_lo(d.p95_total) for d in app.days],
                    [_hi(d.p95_total) for d in app.days],
                ),
            ],
            y_label="seconds",
            y_min=0.0,
            period=period,
        )
    )
    parts.append(
        _table(
            ["stage", "traces with the stage", "p50 (95 % CI)", "p95 (95 % CI)"],
            [[stage, str(n), fmt(p50, " s"), fmt(p95, " s")] for stage, (n, p50, p95) in app.stages.items()],
        )
    )
    parts.append(
        time_chart(
            "Cost per query per day (mean, 95 % CI)",
            [
                Series(
                    "USD per query",
                    times,
                    [_mid(d.cost) for d in app.days],
                    [_lo(d.cost) for d in app.days],
                    [_hi(d.cost) for d in app.days],
                )
            ],
            y_label="USD",
            y_min=0.0,
            period=period,
        )
    )
    parts.append(
        _table(
            [
                "day",
                "traces",
                "regenerations",
                "rate (95 % CI)",
                "band",
                "faithfulness, judge-only (95 % CI)",
                "judged",
                "no claims",
            ],
            [
                [
                    f"{d.start:%Y-%m-%d}",
                    str(d.traces),
                    str(d.regenerations),
                    _pct(d.regeneration),
                    ("no traces" if not d.traces else "no band yet (detector warming up)")
                    if d.band is None
                    else f"{100 * d.band[0]:.3g}–{100 * d.band[1]:.3g} %",
                    fmt(d.faithfulness),
                    str(d.judged),
                    str(d.no_claims),
                ]
                for d in app.days
            ],
        )
    )
    parts.append("<h3>New query groups</h3>")
    if app.groups:
        parts.append(
            _table(
                [
                    "words",
                    "share now (n)",
                    "share in reference (n)",
                    "adjusted p",
                    "example queries",
                    "reference",
                ],
                [
                    [
                        ", ".join(g["terms"]) or "(none)",
                        f"{100 * g['share_window']:.1f} % ({g['n_window']})",
                        f"{100 * g['share_reference']:.1f} % ({g['n_reference']})",
                        f"{g['p_value']:.2g}",
                        " | ".join(g["examples"]),
                        g["reference"],
                    ]
                    for g in app.groups
                ],
            )
        )
    if app.groups_note:
        parts.append(f"<p>{escape(app.groups_note)}</p>")
    return "".join(parts)


_STYLE = (
    "body{font-family:sans-serif;max-width:980px;margin:2em auto;color:#222}"
    "table{border-collapse:collapse;margin:1em 0;font-size:13px}"
    "td,th{border:1px solid #ccc;padding:3px 6px;text-align:left}svg{display:block;margin:1em 0}"
    ".empty{font-size:1.2em;padding:1em;background:#fff4e5;border:1px solid #f0c36d}"
)


def render_html(report: Report) -> str:
    """One self-contained HTML page (inline SVG charts, no scripts, no external files)."""
    title = f"ragmon report {report.since:%Y-%m-%d} to {report.until:%Y-%m-%d}"
    parts = [
        f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{escape(title)}</title>"
        f"<style>{_STYLE}</style></head><body><h1>{escape(title)}</h1>"
        f"<p>Tenant <code>{escape(report.tenant)}</code>; period {minute_utc(report.since)} to "
        f"{minute_utc(report.until)}; generated {minute_utc(report.generated_at)}. "
        "Every interval is a 95 % interval; n is the number of traces (or judgments) behind each number.</p>"
    ]
    if not report.apps:
        parts.append(
            f"<p class='empty'>No traces in this window ({minute_utc(report.since)} to "
            f"{minute_utc(report.until)}): there is nothing to report.</p>"
        )
    for app in report.apps:
        parts.append(_app_html(app, report.alpha, (report.since, report.until)))
    parts.append("</body></html>")
    return "".join(parts)
