"""Server-rendered SVG charts: bars and lines with 95 % error bars, the budget burn-down, meters.

No JavaScript and no external asset: every chart is an inline ``<svg>`` built
here from numbers, with every piece of text (labels, titles, legend entries —
which may come from dataset names or data keys) escaped with
:func:`markupsafe.escape`. Each chart carries ``role="img"`` and a ``<title>``
and ``<desc>`` for screen readers; the pages always show the same numbers as a
table beside it, so nothing is only in the picture. Colours are presentation
attributes (allowed by the pages' ``style-src 'self'`` policy) from the
Okabe–Ito palette, distinguishable with the common colour-vision deficiencies.

An error bar spans value ± the release's 95 % half-width (``ci95``: the
interval [noisy − t, noisy + t] covers the value before noise with
probability ≥ 95 %; see :func:`dpgate.mechanisms.ci95_halfwidth`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Iterable, Sequence

from markupsafe import Markup, escape

__all__ = [
    "PALETTE",
    "Series",
    "bar_chart",
    "burndown_chart",
    "clip_text",
    "date_ticks",
    "fmt_number",
    "line_chart",
    "meter",
    "nice_ticks",
]

#: Series colours (Okabe & Ito 2008), darkest first; each has ≥ 3:1 contrast on white.
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#8F6A00", "#3B7EA1", "#000000", "#7A5195")
_AXIS = "#4a4a4a"
_GRID = "#e3e3e3"
_TEXT = "#222222"
_ERR = "#222222"
_CAP = "#B00020"

W, H = 640, 300
ML, MR, MT, MB = 76, 20, 22, 60
#: Text size in the charts' user units (a chart shown 480 px wide draws it at 10.5 px).
FONT = 14


@dataclass
class Series:
    """One line of a chart.

    Attributes:
        name: legend text (escaped when drawn).
        x: x values (numbers; epoch seconds for time charts).
        y: y values (None: no point).
        err: 95 % half-widths per point (None or not finite: no error bar).
        dashed: draw the line dashed.
        step: draw as a step function (value holds until the next point).
    """

    name: str
    x: list[float]
    y: list[float | None]
    err: list[float | None] = field(default_factory=list)
    dashed: bool = False
    step: bool = False


def _finite(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def fmt_number(v: object, digits: int = 4) -> str:
    """A number for people: ``digits`` significant digits, thousands separators, no ``e`` below 1e15.

    Non-numbers are returned as text; NaN/∞ as ``nan``/``∞``.
    """
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return "" if v is None else str(v)
    if isinstance(v, int):
        return f"{v:,}"
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "∞" if v > 0 else "−∞"
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 1e15 or a < 1e-4:
        mantissa, exponent = f"{v:.{digits - 1}e}".split("e")
        if "." in mantissa:
            mantissa = mantissa.rstrip("0").rstrip(".")
        return f"{mantissa}e{int(exponent)}"
    decimals = max(0, digits - 1 - int(math.floor(math.log10(a))))
    text = f"{v:,.{decimals}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def _tick_label(v: float) -> str:
    a = abs(v)
    for div, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if a >= div:
            return fmt_number(v / div, 3) + suffix
    return fmt_number(v, 3)


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """About ``count`` round tick values covering [lo, hi] (steps of 1, 2, 2.5 or 5 × 10^k)."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return [0.0]
    if hi < lo:
        lo, hi = hi, lo
    if hi == lo:
        pad = abs(hi) * 0.1 or 1.0
        lo, hi = lo - pad, hi + pad
    raw = (hi - lo) / max(1, count)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step) * step
    ticks = []
    v = start
    while v <= hi + step * 0.5 and len(ticks) < 50:
        ticks.append(round(v, 12))
        v += step
    if ticks[-1] < hi:
        ticks.append(round(ticks[-1] + step, 12))
    return ticks


def _short(label: str, n: int = 14) -> str:
    return label if len(label) <= n else label[: n - 1] + "…"


class _Frame:
    """Maps data to pixels inside the plot area."""

    def __init__(self, x0: float, x1: float, y0: float, y1: float) -> None:
        self.x0, self.x1 = x0, (x1 if x1 != x0 else x0 + 1)
        self.y0, self.y1 = y0, (y1 if y1 != y0 else y0 + 1)

    def px(self, x: float) -> float:
        """Pixel column of data value ``x``."""
        return ML + (x - self.x0) / (self.x1 - self.x0) * (W - ML - MR)

    def py(self, y: float) -> float:
        """Pixel row of data value ``y`` (up is larger)."""
        return H - MB - (y - self.y0) / (self.y1 - self.y0) * (H - MT - MB)


def _open(ident: str, title: str, desc: str) -> list[str]:
    i = escape(ident)
    return [
        f'<svg class="chart" viewBox="0 0 {W} {H}" role="img" aria-labelledby="{i}-t {i}-d" '
        f'xmlns="http://www.w3.org/2000/svg" font-family="system-ui, sans-serif" font-size="{FONT}">',
        f'<title id="{i}-t">{escape(title)}</title>',
        f'<desc id="{i}-d">{escape(desc)}</desc>',
    ]


def _y_axis(parts: list[str], frame: _Frame, ticks: Sequence[float], label: str) -> None:
    for t in ticks:
        y = frame.py(t)
        parts.append(f'<line x1="{ML}" x2="{W - MR}" y1="{y:.1f}" y2="{y:.1f}" stroke="{_GRID}"/>')
        parts.append(f'<text x="{ML - 6}" y="{y + 4:.1f}" text-anchor="end" fill="{_TEXT}">'
                     f'{escape(_tick_label(t))}</text>')
    parts.append(f'<line x1="{ML}" x2="{ML}" y1="{MT}" y2="{H - MB}" stroke="{_AXIS}"/>')
    if label:
        parts.append(f'<text x="14" y="{(MT + H - MB) / 2:.1f}" transform="rotate(-90 14 {(MT + H - MB) / 2:.1f})" '
                     f'text-anchor="middle" fill="{_TEXT}">{escape(_short(label, 40))}</text>')


def _x_label(parts: list[str], label: str) -> None:
    if label:
        parts.append(f'<text x="{(ML + W - MR) / 2:.1f}" y="{H - 6}" text-anchor="middle" fill="{_TEXT}">'
                     f'{escape(_short(label, 60))}</text>')


def _x_ticks(parts: list[str], frame: _Frame, ticks: Sequence[tuple[float, str]]) -> None:
    """Tick marks and labels on the x axis (the labels at the ends stay inside the chart)."""
    for t, label in ticks:
        px = frame.px(t)
        anchor = "start" if px < ML + 20 else "end" if px > W - MR - 20 else "middle"
        parts.append(f'<line x1="{px:.1f}" x2="{px:.1f}" y1="{H - MB}" y2="{H - MB + 4}" stroke="{_AXIS}"/>')
        parts.append(f'<text x="{px:.1f}" y="{H - MB + 18}" text-anchor="{anchor}" fill="{_TEXT}">{escape(label)}</text>')


Clip = tuple[float | None, float | None]


def _clipped(v: float, e: float, clip: Clip | None) -> tuple[float, float]:
    """The interval [v − e, v + e] cut to ``clip`` (None ends: no cut)."""
    lo, hi = v - e, v + e
    if clip is not None:
        if clip[0] is not None:
            lo, hi = max(lo, clip[0]), max(hi, clip[0])
        if clip[1] is not None:
            lo, hi = min(lo, clip[1]), min(hi, clip[1])
    return lo, hi


def clip_text(clip: Clip | None) -> str:
    """``[0, 8000]``, ``≥ 0`` or ``≤ 0`` for a clip range ('' for none)."""
    if clip is None or (clip[0] is None and clip[1] is None):
        return ""
    if clip[1] is None:
        return f"≥ {fmt_number(clip[0])}"
    if clip[0] is None:
        return f"≤ {fmt_number(clip[1])}"
    return f"[{fmt_number(clip[0])}, {fmt_number(clip[1])}]"


def _clip_note(parts: list[str], clip: Clip | None, clipped: bool) -> None:
    """The legend entry saying the error bars were cut to the declared range (when one was)."""
    if clipped and clip_text(clip):
        parts.append(f'<text class="clip" x="{ML}" y="{MT - 7}" text-anchor="start" fill="{_TEXT}">'
                     f'{escape("error bars clipped to " + clip_text(clip))}</text>')


def _error_bar(parts: list[str], frame: _Frame, x: float, v: float, e: float, half: float = 4.0,
               clip: Clip | None = None) -> bool:
    """Draw the whisker of v ± e (cut to ``clip``); True if the cut shortened it."""
    a, b = _clipped(v, e, clip)
    lo, hi = frame.py(a), frame.py(b)
    parts.append(f'<path d="M{x:.1f},{lo:.1f}V{hi:.1f}M{x - half:.1f},{lo:.1f}H{x + half:.1f}'
                 f'M{x - half:.1f},{hi:.1f}H{x + half:.1f}" class="err" stroke="{_ERR}" stroke-width="1.2" fill="none"/>')
    return (a, b) != (v - e, v + e)


def _domain(values: Iterable[float | None], errors: Iterable[float | None], *, include_zero: bool,
            clip: Clip | None = None) -> tuple[float, float]:
    lo, hi = (0.0, 0.0) if include_zero else (math.inf, -math.inf)
    for v, e in zip(values, errors):
        if not _finite(v):
            continue
        e = e if _finite(e) else 0.0
        a, b = _clipped(v, e, clip)  # type: ignore[arg-type]
        lo, hi = min(lo, a, v), max(hi, b, v)  # type: ignore[type-var]
    if not math.isfinite(lo):
        return 0.0, 1.0
    return lo, hi


def _ticks_within(lo: float, hi: float, clip: Clip | None) -> list[float]:
    """Round ticks over [lo, hi]; the axis is not extended past a clip bound (a count's axis
    stops at 0, an AVG's at the column's bounds)."""
    ticks = nice_ticks(lo, hi)
    if clip is not None and len(ticks) > 2:
        if clip[0] is not None and ticks[0] < clip[0] <= ticks[1]:
            ticks[0] = float(clip[0])
        if clip[1] is not None and ticks[-2] <= clip[1] < ticks[-1]:
            ticks[-1] = float(clip[1])
    return ticks


def bar_chart(
    labels: Sequence[str],
    values: Sequence[float | None],
    errors: Sequence[float | None] | None = None,
    *,
    ident: str,
    title: str,
    y_label: str = "",
    x_label: str = "",
    color: str = PALETTE[0],
    clip: Clip | None = None,
) -> Markup:
    """Vertical bars, one per label, with ±``errors`` whiskers (95 % half-widths).

    Args:
        labels: category labels (escaped; long ones shortened, full text in the tooltip).
        values: bar heights (None or non-finite: no bar); negative values hang below 0.
        errors: half-widths (None: no whisker).
        ident: unique id prefix on the page (for ``aria-labelledby``).
        title, y_label, x_label: texts (escaped).
        color: bar fill.
        clip: ``(lower, upper)`` the true values lie in (the release's ``value_ranges``;
            None ends: unbounded): whiskers and the axis stop there, and the chart says so.

    Returns:
        The ``<svg>`` markup.
    """
    errors = list(errors) if errors is not None else [None] * len(values)
    n = max(1, len(labels))
    lo, hi = _domain(values, errors, include_zero=True, clip=clip)
    ticks = _ticks_within(lo, hi, clip)
    frame = _Frame(0, n, ticks[0], ticks[-1])
    bars = "with 95 % error bars" if any(_finite(e) for e in errors) else "without error bars"
    desc = f"Bar chart of {y_label or 'values'} for {len(labels)} {x_label or 'groups'}, {bars}."
    parts = _open(ident, title, desc)
    _y_axis(parts, frame, ticks, y_label)
    band = (W - ML - MR) / n
    bw = max(1.0, min(48.0, band * 0.7))
    zero = frame.py(0.0)
    every = max(1, math.ceil(n / 20))
    cut = False
    for i, (label, v) in enumerate(zip(labels, values)):
        cx = ML + band * (i + 0.5)
        e = errors[i] if i < len(errors) else None
        tip = f"{label}: {fmt_number(v)}" + (f" ± {fmt_number(e)}" if _finite(e) else "")
        if _finite(v):
            y = frame.py(v)  # type: ignore[arg-type]
            top, height = min(y, zero), abs(zero - y)
            parts.append(f'<rect x="{cx - bw / 2:.1f}" y="{top:.1f}" width="{bw:.1f}" height="{max(height, 0.5):.1f}" '
                         f'fill="{color}"><title>{escape(tip)}</title></rect>')
            if _finite(e) and e > 0:  # type: ignore[operator]
                cut |= _error_bar(parts, frame, cx, v, e, half=min(6.0, bw / 3), clip=clip)  # type: ignore[arg-type]
        if i % every == 0:
            text = escape(_short(str(label)))
            if n > 8:
                parts.append(f'<text x="{cx:.1f}" y="{H - MB + 12}" text-anchor="end" fill="{_TEXT}" '
                             f'transform="rotate(-40 {cx:.1f} {H - MB + 12})">{text}</text>')
            else:
                parts.append(f'<text x="{cx:.1f}" y="{H - MB + 18}" text-anchor="middle" fill="{_TEXT}">{text}</text>')
    parts.append(f'<line x1="{ML}" x2="{W - MR}" y1="{zero:.1f}" y2="{zero:.1f}" stroke="{_AXIS}"/>')
    if n <= 8:
        _x_label(parts, x_label)
    _clip_note(parts, clip, cut)
    parts.append("</svg>")
    return Markup("".join(parts))


def _legend(parts: list[str], series: Sequence[Series], colors: Sequence[str], extra: Sequence[tuple[str, str, str]] = ()) -> None:
    """A legend row under the plot: (name, colour, dash) entries."""
    entries = [(s.name, c, "6 4" if s.dashed else "") for s, c in zip(series, colors)] + list(extra)
    x = ML
    y = H - 22
    for name, color, dash in entries[:10]:
        label = _short(name, 22)
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        parts.append(f'<line x1="{x}" x2="{x + 18}" y1="{y - 4}" y2="{y - 4}" stroke="{color}" stroke-width="3"{dash_attr}/>')
        parts.append(f'<text x="{x + 22}" y="{y}" fill="{_TEXT}">{escape(label)}</text>')
        x += 30 + 8 * len(label)
        if x > W - 120:
            x = ML
            y += 17


def _path(frame: _Frame, xs: Sequence[float], ys: Sequence[float | None], *, step: bool, until: float | None = None) -> str:
    d: list[str] = []
    pen = False
    last_y: float | None = None
    for x, y in zip(xs, ys):
        if not _finite(y):
            pen = False
            continue
        px, py = frame.px(x), frame.py(y)  # type: ignore[arg-type]
        if not pen:
            d.append(f"M{px:.1f},{py:.1f}")
            pen = True
        elif step:
            d.append(f"H{px:.1f}V{py:.1f}")
        else:
            d.append(f"L{px:.1f},{py:.1f}")
        last_y = py
    if step and pen and until is not None and last_y is not None:
        d.append(f"H{frame.px(until):.1f}")
    return "".join(d)


def line_chart(
    series: Sequence[Series],
    *,
    ident: str,
    title: str,
    x_label: str = "",
    y_label: str = "",
    x_ticks: Sequence[tuple[float, str]] | None = None,
    clip: Clip | None = None,
    x_names: Sequence[str] | None = None,
) -> Markup:
    """Lines (one per series) over a numeric x axis, with points and ±err whiskers.

    Args:
        series: the lines (at most 8 get distinct colours).
        ident, title, x_label, y_label: as for :func:`bar_chart`.
        x_ticks: explicit ``(x, label)`` ticks; default: round numbers.
        clip: as for :func:`bar_chart`.
        x_names: how a point's x is written in its tooltip, per x of the first series
            (e.g. dates); default: the number.

    Returns:
        The ``<svg>`` markup.
    """
    xs = [x for s in series for x in s.x if _finite(x)]
    x0, x1 = (min(xs), max(xs)) if xs else (0.0, 1.0)
    ys: list[float | None] = []
    es: list[float | None] = []
    for s in series:
        ys.extend(s.y)
        es.extend(s.err if s.err else [None] * len(s.y))
    lo, hi = _domain(ys, es, include_zero=True, clip=clip)
    ticks = _ticks_within(lo, hi, clip)
    frame = _Frame(x0, x1, ticks[0], ticks[-1])
    bars = "with 95 % error bars" if any(_finite(e) for e in es) else "without error bars"
    desc = f"Line chart of {y_label or 'values'} by {x_label or 'x'}: {len(series)} series, points {bars}."
    names = {float(x): str(n) for x, n in zip(series[0].x, x_names)} if series and x_names else {}
    parts = _open(ident, title, desc)
    _y_axis(parts, frame, ticks, y_label)
    if x_ticks is None:
        integral = all(float(x).is_integer() for x in xs)
        tv = [t for t in nice_ticks(x0, x1, 8) if x0 <= t <= x1 and (not integral or float(t).is_integer())]
        x_ticks = [(t, str(int(t)) if integral and float(t).is_integer() else _tick_label(t)) for t in tv]
    _x_ticks(parts, frame, x_ticks)
    parts.append(f'<line x1="{ML}" x2="{W - MR}" y1="{frame.py(ticks[0]):.1f}" y2="{frame.py(ticks[0]):.1f}" stroke="{_AXIS}"/>')
    if ticks[0] < 0 < ticks[-1]:
        parts.append(f'<line x1="{ML}" x2="{W - MR}" y1="{frame.py(0):.1f}" y2="{frame.py(0):.1f}" stroke="{_AXIS}"/>')
    colors = [PALETTE[i % len(PALETTE)] for i in range(len(series))]
    npoints = max((len(s.x) for s in series), default=0)
    cut = False
    for s, color in zip(series, colors):
        dash = ' stroke-dasharray="6 4"' if s.dashed else ""
        d = _path(frame, s.x, s.y, step=s.step)
        if d:
            parts.append(f'<path d="{d}" fill="none" stroke="{color}" stroke-width="2"{dash}/>')
        for i, (x, y) in enumerate(zip(s.x, s.y)):
            if not _finite(y):
                continue
            e = s.err[i] if i < len(s.err) else None
            px = frame.px(x)
            if _finite(e) and e > 0:  # type: ignore[operator]
                cut |= _error_bar(parts, frame, px, y, e, half=3.0, clip=clip)  # type: ignore[arg-type]
            if npoints <= 120:
                where = names.get(float(x), fmt_number(x))
                tip = f"{s.name}, {where}: {fmt_number(y)}" + (f" ± {fmt_number(e)}" if _finite(e) else "")
                parts.append(f'<circle cx="{px:.1f}" cy="{frame.py(y):.1f}" r="3" fill="{color}">'  # type: ignore[arg-type]
                             f'<title>{escape(tip)}</title></circle>')
    if len(series) > 1:
        _legend(parts, series, colors)
    else:
        _x_label(parts, x_label)
    _clip_note(parts, clip, cut)
    parts.append("</svg>")
    return Markup("".join(parts))


def date_ticks(days: Sequence[float], count: int = 6) -> list[tuple[float, str]]:
    """About ``count`` ticks over x values in days since 1970-01-01, labelled as dates
    (``YYYY-MM-DD``; ``YYYY-MM`` over more than a year)."""
    if not days:
        return []
    d0, d1 = min(days), max(days)
    fmt = "%Y-%m" if d1 - d0 > 366 else "%Y-%m-%d"
    n = max(2, min(count, int(d1 - d0) + 1))
    return [(d0 + (d1 - d0) * i / (n - 1),
             datetime.fromtimestamp((d0 + (d1 - d0) * i / (n - 1)) * 86400, tz=timezone.utc).strftime(fmt))
            for i in range(n)]


def _time_ticks(t0: float, t1: float, count: int = 6) -> list[tuple[float, str]]:
    span = max(t1 - t0, 1.0)
    fmt = "%H:%M:%S" if span < 600 else "%H:%M" if span < 2 * 86400 else "%m-%d" if span < 300 * 86400 else "%Y-%m"
    return [(t0 + span * i / (count - 1),
             datetime.fromtimestamp(t0 + span * i / (count - 1), tz=timezone.utc).strftime(fmt))
            for i in range(count)]


def burndown_chart(
    consumers: Sequence[Series],
    total: Series,
    cap: Sequence[tuple[float, float]],
    allocation_caps: Sequence[tuple[str, float]],
    *,
    ident: str,
    title: str,
    t0: float,
    t1: float,
    y_label: str = "ρ spent (cumulative)",
    right_ticks: Sequence[tuple[float, str]] = (),
    zoom: bool = False,
) -> Markup:
    """Cumulative spend over time, one step line per consumer and one for the population,
    with the cap as a step line (it changes only by recorded cap changes) and each
    allocation's share of the cap as a dotted line in the consumer's colour.

    Args:
        consumers: per consumer, x = epoch seconds of each charge, y = cumulative ρ after it.
        total: the population's cumulative ρ (same form).
        cap: ``(epoch seconds, ρ_cap)`` from the population's creation and cap changes.
        allocation_caps: ``(consumer, share × ρ_cap now)``, in the order of ``consumers``.
        ident, title, y_label: as for :func:`bar_chart`.
        t0, t1: the time axis (epoch seconds).
        right_ticks: optional ``(ρ, label)`` ticks for a right-hand axis (e.g. ε by the ledger's conversion).
        zoom: scale the y axis to the spend (the cap and allocation lines above it
            are left out and named in the legend) instead of to the cap.

    Returns:
        The ``<svg>`` markup.
    """
    spent = max([v for s in [*consumers, total] for v in s.y if _finite(v)] + [1e-12])
    hi = spent if zoom else max([c for _, c in cap] + [spent])
    ticks = nice_ticks(0.0, hi * 1.05)
    top = ticks[-1]
    above = [("cap above the chart", _CAP, "8 4")] if zoom and any(c > top for _, c in cap) else []
    frame = _Frame(t0, t1 if t1 > t0 else t0 + 1, 0.0, ticks[-1])
    desc = (f"Cumulative privacy spend (ρ) over time for {len(consumers)} consumers and the population total, "
            "with the cap as a red line and each allocation's share as a dotted line.")
    parts = _open(ident, title, desc)
    _y_axis(parts, frame, ticks, y_label)
    _x_ticks(parts, frame, _time_ticks(frame.x0, frame.x1))
    parts.append(f'<line x1="{ML}" x2="{W - MR}" y1="{H - MB}" y2="{H - MB}" stroke="{_AXIS}"/>')
    for y, label in right_ticks:
        if 0 <= y <= top:
            parts.append(f'<text x="{W - MR - 2}" y="{frame.py(y) - 3:.1f}" text-anchor="end" fill="{_TEXT}" '
                         f'font-size="{FONT - 1}">{escape(label)}</text>')
    if cap and not above:
        xs = [max(t, frame.x0) for t, _ in cap]
        ys: list[float | None] = [c for _, c in cap]
        parts.append(f'<path d="{_path(frame, xs, ys, step=True, until=frame.x1)}" fill="none" stroke="{_CAP}" '
                     f'stroke-width="2" stroke-dasharray="8 4"><title>{escape("cap ρ")}</title></path>')
    colors = [PALETTE[i % len(PALETTE)] for i in range(len(consumers))]
    for (name, share_cap), color in zip(allocation_caps, colors):
        if share_cap > top:
            continue
        y = frame.py(share_cap)
        parts.append(f'<line x1="{ML}" x2="{W - MR}" y1="{y:.1f}" y2="{y:.1f}" stroke="{color}" stroke-width="1" '
                     f'stroke-dasharray="2 3"><title>{escape(f"{name}: allocation {fmt_number(share_cap)}")}</title></line>')
    for s, color in zip(consumers, colors):
        d = _path(frame, s.x, s.y, step=True, until=frame.x1)
        if d:
            parts.append(f'<path d="{d}" fill="none" stroke="{color}" stroke-width="2"/>')
    d = _path(frame, total.x, total.y, step=True, until=frame.x1)
    if d:
        parts.append(f'<path d="{d}" fill="none" stroke="{PALETTE[6]}" stroke-width="2.5" stroke-dasharray="1 0"/>')
    _legend(parts, [*consumers, total], [*colors, PALETTE[6]], extra=above or [("cap", _CAP, "8 4")])
    parts.append("</svg>")
    return Markup("".join(parts))


def meter(value: float, maximum: float, *, label: str, width: int = 220, height: int = 14) -> Markup:
    """A horizontal bar showing ``value`` out of ``maximum`` (e.g. ρ spent of an allocation).

    The fill turns orange past 80 % and red past 100 %. ``label`` (escaped) is
    the accessible name; the caller prints the numbers next to it.
    """
    frac = 0.0
    if _finite(value) and _finite(maximum) and maximum > 0:
        frac = max(0.0, float(value) / float(maximum))
    fill = "#B00020" if frac > 1 else "#8F6A00" if frac > 0.8 else "#0072B2"
    inner = min(1.0, frac) * (width - 2)
    pct = f"{frac * 100:.1f} %"
    return Markup(
        f'<svg class="meter" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{escape(label)}: {escape(pct)}" xmlns="http://www.w3.org/2000/svg">'
        f'<rect x="0.5" y="0.5" width="{width - 1}" height="{height - 1}" fill="#ffffff" stroke="{_AXIS}"/>'
        f'<rect x="1" y="1" width="{inner:.1f}" height="{height - 2}" fill="{fill}"/>'
        "</svg>"
    )
