"""Matplotlib panels of a plan report, drawn on `matplotlib.figure.Figure` objects (the Agg canvas, no pyplot,
no display, no global backend switch). Each `draw_*` fills one slot of a grid (a `SubplotSpec`), so the same
panels make the HTML's separate images and the one-page PNG."""

from __future__ import annotations

import io

import matplotlib
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, PathPatch, Rectangle
from matplotlib.path import Path

from uniap.report.timeline import Box, makespan
from uniap.schedules import schedule_named

GB, MB = 1e9, 1e6
COLORS = {"forward": "#4C72B0", "backward": "#55A868", "weight": "#8DCB9A", "send": "#DD8452", "send-grad": "#C44E52",
          "sync": "#8172B2", "bubble": "#EEEEEE"}
PREDICTED, MEASURED, CAPACITY = "#4C72B0", "#DD8452", "#C44E52"
STATES, ACTIVATIONS, IDLE_EDGE = "#4C72B0", "#8FB3DE", "#BBBBBB"
WORK = ("forward", "backward", "weight")
SENDS = ("send", "send-grad")
SEND_PIXELS = 1000  # a send is drawn at least this share of its stretch wide (about a pixel on a screen)
COLLAPSE_ABOVE = 1200  # forward and backward boxes above which the timeline's steady state is not drawn
LABEL_AT_MOST = 300  # forward and backward boxes in a window above which they carry no micro-batch number
EDGES_AT_MOST = 1500  # boxes in a window above which they lose their white edges (thin ones wash out), touching
# ones of a colour are joined and they are embedded in the SVG as an image (the text stays text)
WINDOW_GAP = 0.9  # inches between the fill and the drain of a collapsed timeline (room for the x label and a title)
LIGHTEST = 0.6  # a stage's last chunk is its colour mixed this far towards white, its first the colour itself


def _unit(seconds: float) -> tuple[float, str]:
    return (1.0, "s") if seconds >= 1 else (1e3, "ms")


def shade(colour: str, local: int, virtual_stages: int) -> tuple[float, float, float]:
    """`colour` for a stage's chunk number `local` (0 first, darkest) of `virtual_stages`."""
    mix = LIGHTEST * local / max(virtual_stages - 1, 1)
    return tuple(c + (1 - c) * mix for c in to_rgb(colour))


def chunk_keys(virtual_stages: int) -> list[int]:
    """The chunk numbers a legend shows: all of up to four, else the first, a middle one and the last."""
    v = virtual_stages
    return list(range(v)) if v <= 4 else [0, (v - 1) // 2, v - 1]


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def chunk_legend(colour: str, virtual_stages: int) -> list[Patch]:
    return [Patch(facecolor=shade(colour, k, virtual_stages), label=f"{_ordinal(k + 1)} chunk of a stage")
            for k in chunk_keys(virtual_stages)]


def timeline_windows(boxes: list[Box], stages: int, micro_batches: int,
                     limit: int = COLLAPSE_ABOVE) -> list[tuple[float, float]]:
    """The stretches of time a timeline draws: the whole iteration, or, above `limit` forward and backward boxes,
    the fill with the start of the steady state, and the end of the steady state with the drain (the steady
    state in between repeats the same pattern). The fill ends when the last stage to start a backward starts it,
    the drain starts when the first stage to finish its forwards finishes them; each stretch runs two
    micro-batches (of the busiest stage) into the steady state."""
    end = makespan(boxes)
    work = [b for b in boxes if b.kind in WORK]
    if len(work) <= limit:
        return [(0.0, end)]
    first_backward, last_forward, busy = [end] * stages, [0.0] * stages, [0.0] * stages
    for b in work:
        busy[b.stage] += b.duration
        if b.kind == "backward":
            first_backward[b.stage] = min(first_backward[b.stage], b.start)
        else:
            last_forward[b.stage] = max(last_forward[b.stage], b.end)
    pad = 2 * max(busy) / micro_batches
    fill, drain = max(first_backward) + pad, min(last_forward) - pad
    return [(0.0, end)] if fill >= drain else [(0.0, fill), (drain, end)]


def draw_timeline(fig: Figure, slot, boxes: list[Box], stages: int, schedule: str, micro_batches: int,
                  predicted_tpi: float | None = None, virtual_stages: int = 1,
                  measured_tpi: float | None = None) -> list:
    """Stages as rows (stage 0 on top), forward/backward boxes labelled by micro-batch when there is room,
    sends between rows, idle time hatched. Under the interleaved schedule a stage's chunks are shaded from its
    colour (its first chunk) to a lighter one (its last). Large pipelines draw the fill and the drain only
    (`timeline_windows`), one above the other. Returns the axes."""
    windows = timeline_windows(boxes, stages, micro_batches)
    end = max(makespan(boxes), measured_tpi or 0.0) or 1.0
    scale, unit = _unit(end)
    n = len(windows)
    tall = slot.get_position(fig).height * fig.get_figheight()  # inches
    grid = slot.subgridspec(n, 1, hspace=WINDOW_GAP / ((tall - WINDOW_GAP * (n - 1)) / n) if n > 1 else 0)
    axes = [fig.add_subplot(grid[k, 0]) for k in range(len(windows))]
    for k, (ax, (lo, hi)) in enumerate(zip(axes, windows)):
        if k == len(windows) - 1:
            hi = end
        _draw_window(ax, [b for b in boxes if b.end > lo and b.start < hi], stages, virtual_stages, lo, hi, scale)
        for t, style in ((predicted_tpi, dict(color="black", linestyle="--", linewidth=1)),
                         (measured_tpi, dict(color=MEASURED, linestyle="-", linewidth=1.5))):
            if t is not None and lo <= t <= hi * 1.02:
                ax.axvline(t * scale, **style)
        ax.set_xlabel(f"time ({unit})")
    chosen = schedule_named(schedule)
    name = chosen.title + (f", {virtual_stages} chunks per stage" if virtual_stages > 1 else "")
    split = " (its weight pass drawn apart)" if chosen.split_backward else ""
    head = (f"pipeline timeline: {name}, {stages} stage(s), {micro_batches} micro-batch(es) — forward ≈ p/3, "
            f"backward ≈ 2p/3{split} of each stage's (chunk's) time p")
    if len(windows) == 1:
        axes[0].set_title(head, fontsize=9)
    else:
        (_, fill), (drain, _) = windows
        axes[0].set_title(f"{head}\nfill and the start of the steady state, 0–{fill * scale:.3g} {unit}",
                          fontsize=9)
        axes[1].set_title(f"steady state from {fill * scale:.3g} to {drain * scale:.3g} {unit} "
                          f"({(drain - fill) / end * 100:.0f} % of the iteration) not drawn: it repeats the pattern "
                          f"at the edges; end of the steady state and the drain", fontsize=9)
    kinds = ("forward", "backward") + (("weight",) if chosen.split_backward else ()) + ("send", "send-grad", "sync")
    handles = [Patch(facecolor=COLORS[k], label=k) for k in kinds]
    handles.append(Patch(facecolor=COLORS["bubble"], hatch="//", edgecolor=IDLE_EDGE, label="idle (bubble)"))
    if virtual_stages > 1:
        handles += chunk_legend(COLORS["forward"], virtual_stages)
    if predicted_tpi is not None:
        handles.append(Line2D([], [], color="black", linestyle="--", label="predicted iteration time"))
    if measured_tpi is not None:
        handles.append(Line2D([], [], color=MEASURED, linestyle="-", label="measured iteration time"))
    axes[0].legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)
    return axes


def _draw_window(ax, boxes: list[Box], stages: int, virtual_stages: int, lo: float, hi: float,
                 scale: float) -> None:
    """The boxes of one stretch [lo, hi] of the timeline on `ax`: one compound path per colour (a small SVG),
    rasterized above `EDGES_AT_MOST` boxes."""
    work = [b for b in boxes if b.kind in WORK]
    edge = "white" if len(boxes) <= EDGES_AT_MOST else "none"
    for i in range(stages):  # idle wherever nothing is drawn on top
        ax.add_patch(Rectangle((lo * scale, i - 0.4), (hi - lo) * scale, 0.8, facecolor=COLORS["bubble"],
                               edgecolor=IDLE_EDGE, linewidth=0, hatch="//"))
    groups: dict[tuple, list[tuple[float, float, float, float]]] = {}
    for b in boxes:
        if b.kind == "bubble" or b.duration <= 0:
            continue
        if b.kind in ("forward", "backward", "sync"):
            y, h = b.stage - 0.4, 0.8
        else:  # sends run on the link between stage b.stage and b.stage + 1
            y, h = b.stage + 0.42 + (0.0 if b.kind == "send" else 0.08), 0.08
        local = b.chunk // stages if b.chunk >= 0 else 0
        colour = shade(COLORS[b.kind], local, virtual_stages) if b.kind in WORK else to_rgb(COLORS[b.kind])
        wide = b.duration if b.kind not in SENDS else max(b.duration, (hi - lo) / SEND_PIXELS)
        groups.setdefault(colour, []).append((b.start * scale, y, (b.start + wide) * scale, y + h))
    for colour, rects in groups.items():
        ax.add_patch(_rectangles(rects if edge != "none" else _joined(rects), facecolor=colour, edgecolor=edge,
                                 linewidth=0.4, rasterized=edge == "none"))
    if len(work) <= LABEL_AT_MOST:
        for b in work:
            if b.duration > (hi - lo) / 120:
                ax.text((b.start + b.duration / 2) * scale, b.stage, str(b.micro), ha="center", va="center",
                        fontsize=6, color="white")
    ax.set_xlim(lo * scale, lo * scale + (hi - lo) * scale * 1.02)
    ax.set_ylim(stages - 0.5, -0.5)
    ax.set_yticks(range(stages))
    ax.set_yticklabels([f"stage {i}" for i in range(stages)], fontsize=7 if stages > 8 else None)


def _joined(rects: list[tuple[float, float, float, float]]) -> list[tuple[float, float, float, float]]:
    """Rectangles of one row and colour that touch, joined into one (drawn without edges they look the same)."""
    out: list[list[float]] = []
    for x0, y0, x1, y1 in sorted(rects, key=lambda r: (r[1], r[0])):
        if out and out[-1][1] == y0 and x0 <= out[-1][2] * (1 + 1e-9):
            out[-1][2] = max(out[-1][2], x1)
        else:
            out.append([x0, y0, x1, y1])
    return [tuple(r) for r in out]


def _rectangles(rects, **style) -> PathPatch:
    """Rectangles (x0, y0, x1, y1) as one patch."""
    r = np.asarray(rects, dtype=float).reshape(-1, 4)
    corners = np.stack([r[:, [0, 1]], r[:, [2, 1]], r[:, [2, 3]], r[:, [0, 3]]], axis=1)
    return PathPatch(Path.make_compound_path_from_polys(corners), **style)


def _text_width(ax, text: str, fontsize: float) -> float:
    """Rough width of `text` in data units of `ax`'s x axis (0.6 em a character)."""
    fig = ax.get_figure()
    inches = ax.get_position().width * fig.get_figwidth()
    lo, hi = ax.get_xlim()
    return len(text) * 0.6 * fontsize / 72 / inches * (hi - lo)


def draw_strategy_map(fig: Figure, slot, stage_of: np.ndarray, labels: list[str], names: list[str],
                      stages: int | None = None):
    """One cell per layer coloured by its strategy; stage boundaries as vertical lines. `stages` fewer than the
    pieces of `stage_of`: the pieces are interleaved chunks, labelled c<j>·s<i> (chunk j runs on stage
    i = j mod P). A label that would overlap the previous one is left out."""
    ax = fig.add_subplot(slot)
    L = len(stage_of)
    distinct = list(dict.fromkeys(labels))
    cmap = matplotlib.colormaps["tab20" if len(distinct) > 10 else "tab10"]
    color = {s: cmap(i % cmap.N) for i, s in enumerate(distinct)}
    for s in distinct:
        cells = [(u, 0, u + 1, 1) for u in range(L) if labels[u] == s]
        ax.add_patch(_rectangles(cells, facecolor=color[s], edgecolor="white", linewidth=0.3 if L <= 200 else 0))
    ax.set_xlim(0, L)
    ax.set_ylim(0, 1.35)
    P = int(stage_of.max()) + 1
    interleaved = stages is not None and stages != P
    right = -np.inf
    for i in range(P):
        members = np.flatnonzero(stage_of == i)
        lo, hi = members[0], members[-1] + 1
        if i:
            ax.vlines(lo, 0, 1, color="black", linewidth=1.5 if P <= 32 else 0.6)
        text = f"c{i}·s{i % stages}" if interleaved else f"stage {i}"
        half = _text_width(ax, text, 7) / 2
        if (lo + hi) / 2 - half > right:
            ax.text((lo + hi) / 2, 1.08, text, ha="center", va="bottom", fontsize=7)
            right = (lo + hi) / 2 + half + _text_width(ax, " ", 7)
    ax.set_yticks([])
    step = max(1, L // 16)
    ticks = list(range(0, L, step))
    ax.set_xticks([t + 0.5 for t in ticks])
    ax.set_xticklabels([names[t] for t in ticks], rotation=60, ha="right", fontsize=6)
    ax.set_xlabel("layer")
    ax.set_title("strategy of each layer" + (" (c<j>·s<i>: chunk j, on stage i)" if interleaved else ""),
                 fontsize=9)
    ax.legend(handles=[Patch(facecolor=color[s], label=s) for s in distinct], loc="center left",
              bbox_to_anchor=(1.01, 0.5), ncol=1 if len(distinct) <= 8 else 2, fontsize=7, frameon=False)
    return ax


def _stage_ticks(ax, stages: int) -> None:
    """Stage numbers under the bars, thinned out so that they never touch."""
    step = 1 if stages <= 24 else -(-stages // 24)
    ax.set_xticks(range(0, stages, step))
    ax.set_xticklabels([str(i) for i in range(0, stages, step)], fontsize=7)
    ax.set_xlabel("stage")


def _stacked(ax, x, parts: list[tuple[np.ndarray, dict]], width: float) -> None:
    bottom = np.zeros(len(x))
    for values, style in parts:
        ax.bar(x, values, width, bottom=bottom, **style)
        bottom = bottom + values


def draw_memory(fig: Figure, slot, peak: list[float], device: float | None, reserve: float | None,
                states: list[float] | None = None, activations: list[float] | None = None,
                measured: list[float] | None = None):
    """Peak memory per stage against what the device offers, the framework reserve on one side only: model states
    and activations stacked against the device's memory less the reserve when the plan was re-costed; else
    (`states` None) the plan file's peaks, reserve inside, against the whole device. The axis is in MB when the
    bars are under 1 GB; a limit far above the bars is named, not drawn."""
    ax = fig.add_subplot(slot)
    P = len(peak)
    x = np.arange(P)
    split = states is not None and reserve is not None
    used = np.asarray(states) + np.asarray(activations) if split else np.asarray(peak)
    top = max(list(used) + list(measured or []) + [0.0])
    unit, name = (GB, "GB") if top >= GB else (MB, "MB")
    width = 0.38 if measured is not None else 0.6
    left = x - (width / 2 if measured is not None else 0)
    if split:
        _stacked(ax, left, [(np.asarray(states) / unit, dict(color=STATES, label="model states")),
                            (np.asarray(activations) / unit, dict(color=ACTIVATIONS, label="activations"))], width)
        limit = None if device is None else device - reserve
        what = f"device memory less the {reserve / unit:,.3g} {name} framework reserve"
    else:
        ax.bar(left, used / unit, width, color=PREDICTED, label="predicted peak (framework reserve included)")
        limit, what = device, "device memory"
    if measured is not None:
        ax.bar(x + width / 2, np.asarray(measured) / unit, width, color=MEASURED, label="measured")
    ceiling = top / unit * 1.45 or 1.0  # room for the legend
    title = "peak memory per stage"
    if limit and limit / unit <= ceiling * 3:
        ax.axhline(limit / unit, color=CAPACITY, linestyle="--", linewidth=1.2, label=what)
        ceiling = max(ceiling, limit / unit * 1.5)
    elif limit:
        title += f"\n({what}: {limit / unit:,.0f} {name}, far above)"
    ax.set_ylim(0, ceiling)
    _stage_ticks(ax, P)
    ax.set_ylabel(f"{name} per device")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="upper left")
    return ax


def draw_stage_times(fig: Figure, slot, predicted: list[float], measured: list[float] | None = None,
                     chunks: list[float] | None = None):
    """Forward + backward time of one micro-batch on each stage: predicted (cost model), stacked by chunk under
    interleaving (`chunks`: per chunk position k, per stage, the stage's k-th chunk), and measured when a run is
    given."""
    ax = fig.add_subplot(slot)
    P = len(predicted)
    x = np.arange(P)
    scale, unit = _unit(max(list(predicted) + list(measured or [])) or 1.0)
    width = 0.38 if measured is not None else 0.6
    left = x - (width / 2 if measured is not None else 0)
    v = len(chunks) if chunks is not None else 1
    if v > 1:
        keys = chunk_keys(v)
        per_chunk = np.asarray(chunks, dtype=float) * scale  # [k, d]: stage d's k-th chunk
        _stacked(ax, left, [(per_chunk[k], dict(color=shade(PREDICTED, k, v), edgecolor="white", linewidth=0.3,
                                                 label=f"predicted, {_ordinal(k + 1)} chunk" if k in keys else None))
                            for k in range(v)], width)
    else:
        ax.bar(left, np.asarray(predicted) * scale, width, color=PREDICTED, label="predicted")
    if measured is not None:
        ax.bar(x + width / 2, np.asarray(measured) * scale, width, color=MEASURED, label="measured")
    top = max(list(predicted) + list(measured or []) + [0.0]) * scale
    ax.set_ylim(0, top * 1.45 or 1.0)
    _stage_ticks(ax, P)
    ax.set_ylabel(f"{unit} per micro-batch (fwd + bwd)")
    ax.set_title("stage time per micro-batch: predicted" + (" vs measured" if measured is not None else ""),
                 fontsize=9)
    ax.legend(fontsize=7, loc="upper left", ncol=2)
    return ax


def new_figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


def png_bytes(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=200, bbox_inches="tight")
    return buf.getvalue()


def svg_bytes(fig: Figure) -> bytes:
    """Vector figures for the HTML report: sharp at any width, their text kept as text (the browser can find
    it and a screen reader read it)."""
    buf = io.BytesIO()
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        fig.savefig(buf, format="svg", bbox_inches="tight", dpi=200)
    return buf.getvalue()
