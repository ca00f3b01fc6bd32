"""Matplotlib panels of a plan report, drawn on `matplotlib.figure.Figure` objects (the Agg canvas, no pyplot,
no display, no global backend switch). Each `draw_*` fills one Axes, so the same panels make the HTML's separate
images and the one-page PNG."""

from __future__ import annotations

import io

import matplotlib
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

from uniap.report.timeline import Box, makespan

GB = 1e9
COLORS = {"forward": "#4C72B0", "backward": "#55A868", "send": "#DD8452", "send-grad": "#C44E52",
          "sync": "#8172B2", "bubble": "#EEEEEE"}
PREDICTED, MEASURED, CAPACITY = "#4C72B0", "#DD8452", "#C44E52"


def _unit(seconds: float) -> tuple[float, str]:
    return (1.0, "s") if seconds >= 1 else (1e3, "ms")


def draw_timeline(ax, boxes: list[Box], stages: int, schedule: str, micro_batches: int,
                  predicted_tpi: float | None = None, virtual_stages: int = 1,
                  measured_tpi: float | None = None) -> None:
    """Stages as rows (stage 0 on top), forward/backward boxes labelled by micro-batch, sends between rows. Under
    the interleaved schedule a stage's chunks are shaded from dark (its first chunk) to light (its last)."""
    span = max(makespan(boxes), measured_tpi or 0.0) or 1.0
    scale, unit = _unit(span)
    label_boxes = stages * micro_batches <= 160
    for b in boxes:
        x, w = b.start * scale, b.duration * scale
        if b.kind in ("forward", "backward", "sync", "bubble"):
            y, h = b.stage - 0.4, 0.8
        else:  # sends run on the link between stage b.stage and b.stage + 1
            y, h = b.stage + 0.42 + (0.0 if b.kind == "send" else 0.08), 0.08
        if w <= 0:
            continue
        local = b.chunk // stages if b.chunk >= 0 else 0
        alpha = 1.0 - 0.6 * local / max(virtual_stages - 1, 1)
        ax.add_patch(Rectangle((x, y), w, h, facecolor=COLORS[b.kind], edgecolor="white" if b.kind != "bubble"
                               else "#BBBBBB", linewidth=0.4, hatch="//" if b.kind == "bubble" else None,
                               alpha=alpha))
        if label_boxes and b.kind in ("forward", "backward") and w > span * scale / 120:
            ax.text(x + w / 2, b.stage, str(b.micro), ha="center", va="center", fontsize=6, color="white")
    ax.set_xlim(0, span * scale * 1.02)
    ax.set_ylim(stages - 0.5, -0.5)
    ax.set_yticks(range(stages))
    ax.set_yticklabels([f"stage {i}" for i in range(stages)])
    ax.set_xlabel(f"time ({unit})")
    if predicted_tpi is not None:
        ax.axvline(predicted_tpi * scale, color="black", linestyle="--", linewidth=1)
    if measured_tpi is not None:
        ax.axvline(measured_tpi * scale, color=MEASURED, linestyle="-", linewidth=1.5)
    name = {"gpipe": "GPipe", "1f1b": "1F1B"}.get(schedule, f"interleaved 1F1B, {virtual_stages} chunks per stage")
    ax.set_title(f"pipeline timeline: {name}, {stages} stage(s), {micro_batches} micro-batch(es) — forward ≈ p/3, "
                 f"backward ≈ 2p/3 of each stage's (chunk's) time p", fontsize=9)
    handles = [Patch(facecolor=COLORS[k], label=k, hatch="//" if k == "bubble" else None,
                     edgecolor="#BBBBBB" if k == "bubble" else None)
               for k in ("forward", "backward", "send", "send-grad", "sync", "bubble")]
    if predicted_tpi is not None:
        handles.append(Line2D([], [], color="black", linestyle="--", label="predicted iteration time"))
    if measured_tpi is not None:
        handles.append(Line2D([], [], color=MEASURED, linestyle="-", label="measured iteration time"))
    ax.legend(handles=handles, loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=7, frameon=False)


def draw_strategy_map(ax, stage_of: np.ndarray, labels: list[str], names: list[str], stages: int | None = None) -> None:
    """One cell per layer coloured by its strategy; stage boundaries as vertical lines. `stages` fewer than the
    pieces of `stage_of`: the pieces are interleaved chunks, labelled with their stage (chunk j on j mod P)."""
    L = len(stage_of)
    distinct = list(dict.fromkeys(labels))
    cmap = matplotlib.colormaps["tab20" if len(distinct) > 10 else "tab10"]
    color = {s: cmap(i % cmap.N) for i, s in enumerate(distinct)}
    for u, s in enumerate(labels):
        ax.add_patch(Rectangle((u, 0), 1, 1, facecolor=color[s], edgecolor="white", linewidth=0.3))
    P = int(stage_of.max()) + 1
    for i in range(P):
        members = np.flatnonzero(stage_of == i)
        lo, hi = members[0], members[-1] + 1
        if i:
            ax.axvline(lo, color="black", linewidth=1.5)
        text = f"stage {i}" if stages is None or stages == P else f"chunk {i} · stage {i % stages}"
        ax.text((lo + hi) / 2, 1.08, text, ha="center", va="bottom", fontsize=7)
    ax.set_xlim(0, L)
    ax.set_ylim(0, 1.35)
    ax.set_yticks([])
    step = max(1, L // 16)
    ticks = list(range(0, L, step))
    ax.set_xticks([t + 0.5 for t in ticks])
    ax.set_xticklabels([names[t] for t in ticks], rotation=60, ha="right", fontsize=6)
    ax.set_xlabel("layer")
    ax.set_title("strategy of each layer", fontsize=9)
    ax.legend(handles=[Patch(facecolor=color[s], label=s) for s in distinct], loc="center left",
              bbox_to_anchor=(1.01, 0.5), ncol=1 if len(distinct) <= 8 else 2, fontsize=7, frameon=False)


def _bars(ax, predicted: list[float], measured: list[float] | None, scale: float) -> None:
    x = np.arange(len(predicted))
    width = 0.38 if measured is not None else 0.6
    ax.bar(x - (width / 2 if measured is not None else 0), np.asarray(predicted) * scale, width, color=PREDICTED,
           label="predicted")
    if measured is not None:
        ax.bar(x + width / 2, np.asarray(measured) * scale, width, color=MEASURED, label="measured")
    ax.set_xticks(x)
    ax.set_xticklabels([f"stage {i}" for i in x], fontsize=7)
    top = max(list(predicted) + list(measured or []) + [0.0]) * scale
    ax.set_ylim(0, top * 1.35 or 1.0)  # room for the legend


def draw_memory(ax, predicted: list[float], capacity: float | None, measured: list[float] | None = None) -> None:
    """Peak memory per stage (model states + activations, no framework reserve) against the usable capacity;
    in MB when everything is under 1 GB, so small runs stay visible."""
    top = max(list(predicted) + list(measured or []) + [capacity or 0.0])
    unit, name = (GB, "GB") if top >= GB or (capacity or 0) >= GB else (1e6, "MB")
    _bars(ax, predicted, measured, 1 / unit)
    if capacity:
        ax.axhline(capacity / unit, color=CAPACITY, linestyle="--", linewidth=1.2, label="usable capacity")
        ax.set_ylim(0, max(ax.get_ylim()[1], capacity / unit * 1.3))
    ax.set_ylabel(f"{name} per device")
    ax.set_title("peak memory per stage", fontsize=9)
    ax.legend(fontsize=7)


def draw_stage_times(ax, predicted: list[float], measured: list[float] | None = None) -> None:
    """Time per micro-batch of each stage: predicted (cost model) and, when a run is given, measured."""
    scale, unit = _unit(max(list(predicted) + list(measured or [])) or 1.0)
    _bars(ax, predicted, measured, scale)
    ax.set_ylabel(f"{unit} per micro-batch")
    ax.set_title("stage time: predicted" + (" vs measured" if measured is not None else ""), fontsize=9)
    ax.legend(fontsize=7)


def new_figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


def png_bytes(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=200, bbox_inches="tight")
    return buf.getvalue()


def svg_bytes(fig: Figure) -> bytes:
    """Vector figures for the HTML report: sharp at any width."""
    buf = io.BytesIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    return buf.getvalue()
