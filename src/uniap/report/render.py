"""`render_report`: one static HTML page (SVG figures embedded as base64, no scripts, no network) for a plan,
optionally with a run's measured figures beside the predicted ones."""

from __future__ import annotations

import base64
import hashlib
import html
import json
import math
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from uniap.errors import UniapError
from uniap.plan import Plan
from uniap.report import figures
from uniap.report.timeline import Box, simulate
from uniap.spec.cluster import ClusterSpec


@dataclass
class Figures:
    """What the report draws, per stage: predicted p (per micro-batch), o (boundaries), g (once), memory."""

    p: list[float]
    o: list[float]
    g: list[float]
    memory: list[float]  # peak bytes per device the plan's layers use (model states + activations; no reserve)
    capacity: float | None  # device memory in bytes
    tpi: float | None
    note: str = ""  # why the plan could not be re-costed (figures then come from the plan's `predicted`)
    chunk_p: list[float] | None = None  # per chunk, under the interleaved schedule (None: p per stage)
    reserve: float = 0.0  # bytes per device kept for the framework, not counted in `memory` nor `capacity`


def recost(plan: Plan, cluster: ClusterSpec | str | None = None) -> Figures:
    """Per-stage figures by re-costing the plan (`estimate.cost_plan` + `solve.program.stage_times`), so the
    report shows the cost model's numbers; falls back to the plan's `predicted` section if that is impossible."""
    from uniap.estimate import cost_plan, evaluate_unchecked
    from uniap.solve.program import stage_times
    from uniap.spec.cluster import load_cluster
    from uniap.spec.families import build_layers

    try:
        model = build_layers(plan.model_config(), int(plan.model["seq_len"]))
        clus = cluster if isinstance(cluster, ClusterSpec) else load_cluster(cluster or str(plan.cluster["name"]))
        if plan.engine is not None and not isinstance(cluster, ClusterSpec):
            clus = replace(clus, engine=plan.engine)  # as the plan was costed (estimate --plan does the same)
        if clus.devices != plan.world_size:
            raise UniapError(f"cluster {clus.name} has {clus.devices} devices, the plan {plan.world_size}")
        program, stage_of, strategy_of = cost_plan(plan, model, clus)
        times = stage_times(program, stage_of, strategy_of)
        tpi = evaluate_unchecked(program, stage_of, strategy_of)
        return Figures(p=[float(x) for x in times.p], o=[float(x) for x in times.o], g=[float(x) for x in times.g],
                       memory=[float(m) for m in times.memory], capacity=float(clus.memory_capacity),
                       tpi=float(tpi), reserve=float(clus.device.reserve_bytes),
                       chunk_p=[float(x) for x in times.chunk_p])
    except UniapError as exc:
        pred = plan.predicted or {}
        P = len(plan.stages)
        p = [float(x) for x in pred.get("stage_time_s", [])]
        if len(p) != P:
            raise UniapError(f"cannot re-cost the plan ({exc}) and its predicted section has no stage times") \
                from None
        memory = [float(x) for x in pred.get("peak_memory_bytes", [0.0] * P)]  # reserve included here
        cap = pred.get("memory_capacity_bytes")
        v = plan.virtual_stages
        return Figures(p=p, o=[0.0] * (P * v - 1), g=[0.0] * P,
                       chunk_p=[p[j % P] / v for j in range(P * v)] if v > 1 else None, memory=memory if len(memory) == P else [0.0] * P,
                       capacity=float(cap) if cap else None, tpi=pred.get("iteration_time_s"),
                       note=f"not re-costed ({exc}); stage times from the plan file, sends and sync not shown; "
                            "memory as the plan file gives it (framework reserve included, capacity the whole device)")


def _per_stage(values, plan: Plan, what: str) -> list[float] | None:
    """A run's list, per stage (P entries) or per rank (world-size entries: the worst rank of each stage)."""
    if values is None:
        return None
    if not isinstance(values, (list, tuple)) or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                        for v in values):
        raise UniapError(f"run: {what} must be a list of numbers")
    P, n = len(plan.stages), plan.world_size
    if len(values) == P:
        return [float(v) for v in values]
    if len(values) == n:
        return [max(float(values[r]) for r in stage.ranks) for stage in plan.stages]
    raise UniapError(f"run: {what} has {len(values)} entries; expected {P} (stages) or {n} (ranks)")


def check_run(run: dict | None, plan: Plan) -> dict | None:
    """The measured figures of a run's JSON, per stage; UniapError (one line) if malformed."""
    if run is None:
        return None
    if not isinstance(run, dict):
        raise UniapError("run: expected a JSON object with iteration_time_s, stage_time_s, peak_memory_bytes")
    t = run.get("iteration_time_s")
    if t is not None and (not isinstance(t, (int, float)) or isinstance(t, bool) or not t > 0):
        raise UniapError(f"run: iteration_time_s must be a positive number, got {t!r}")
    per_step = _per_stage(run.get("stage_time_s"), plan, "stage_time_s")
    c = int(plan.pipeline["micro_batches"])  # a run's stage time adds up every micro-batch of a step
    return {"iteration_time_s": None if t is None else float(t),
            "stage_time_s": None if per_step is None else [x / c for x in per_step],
            "peak_memory_bytes": _per_stage(run.get("peak_memory_bytes"), plan, "peak_memory_bytes")}


def timeline_boxes(plan: Plan, fig: Figures) -> list[Box]:
    return simulate(str(plan.pipeline["schedule"]), fig.chunk_p or fig.p, fig.o, fig.g,
                    int(plan.pipeline["micro_batches"]), plan.virtual_stages)


def _panels(plan: Plan, fig: Figures, measured: dict | None):
    """(name, draw(ax)) of every panel."""
    P, c, schedule = len(plan.stages), int(plan.pipeline["micro_batches"]), str(plan.pipeline["schedule"])
    boxes = timeline_boxes(plan, fig)
    stage_of = np.array([layer.position for layer in plan.layers])  # chunk boundaries under interleaving
    labels = [layer.strategy.label() for layer in plan.layers]
    names = [layer.name for layer in plan.layers]
    m = measured or {}
    return [
        ("timeline", lambda ax: figures.draw_timeline(ax, boxes, P, schedule, c, fig.tpi, plan.virtual_stages,
                                                      m.get("iteration_time_s"))),
        ("strategies", lambda ax: figures.draw_strategy_map(ax, stage_of, labels, names, P)),
        ("memory", lambda ax: figures.draw_memory(ax, fig.memory, fig.capacity, m.get("peak_memory_bytes"))),
        ("stage-times", lambda ax: figures.draw_stage_times(ax, fig.p, m.get("stage_time_s"))),
    ]


def _sizes(P: int, L: int) -> dict[str, tuple[float, float]]:
    return {"timeline": (11.0, 1.6 + 0.45 * P), "strategies": (11.0, 2.6), "memory": (5.4, 3.0),
            "stage-times": (5.4, 3.0)}


def panel_images(plan: Plan, fig: Figures, measured: dict | None = None) -> dict[str, bytes]:
    """Each panel as its own SVG."""
    sizes = _sizes(len(plan.stages), len(plan.layers))
    out = {}
    for name, draw in _panels(plan, fig, measured):
        f = figures.new_figure(*sizes[name])
        draw(f.add_subplot(1, 1, 1))
        out[name] = figures.svg_bytes(f)
    return out


def one_page_png(plan: Plan, fig: Figures, measured: dict | None = None) -> bytes:
    """All panels on one page: timeline, strategy map, then memory and stage times side by side."""
    P = len(plan.stages)
    top = 1.6 + 0.45 * P
    f = figures.new_figure(11.0, top + 2.8 + 3.2)
    f.suptitle(_title(plan), fontsize=11, fontweight="bold")
    grid = f.add_gridspec(3, 2, height_ratios=[top, 2.4, 3.0], hspace=0.7, wspace=0.25)
    panels = dict(_panels(plan, fig, measured))
    panels["timeline"](f.add_subplot(grid[0, :]))
    panels["strategies"](f.add_subplot(grid[1, :]))
    panels["memory"](f.add_subplot(grid[2, 0]))
    panels["stage-times"](f.add_subplot(grid[2, 1]))
    return figures.png_bytes(f)


def _fmt_time(seconds) -> str:
    if seconds is None or not isinstance(seconds, (int, float)) or not math.isfinite(seconds):
        return "—"
    return f"{seconds:.3f} s" if seconds >= 1 else f"{seconds * 1e3:.2f} ms"


def _gb(nbytes) -> str:
    if nbytes is None:
        return "—"
    return f"{nbytes / 1e9:.2f} GB" if nbytes >= 1e9 else f"{nbytes / 1e6:.1f} MB"


CSS = """body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em auto;max-width:1100px;
color:#222;padding:0 1em}h1{font-size:1.5em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.9em}td,th{border:1px solid #ddd;padding:.25em .6em;text-align:left;
vertical-align:top}th{background:#f5f5f5}td.n{text-align:right}img{max-width:100%;height:auto;display:block;
margin:.5em 0}.note{color:#666;font-size:.85em}.bad{color:#b00}pre{margin:0;font-family:inherit;white-space:pre-wrap}"""


def _title(plan: Plan) -> str:
    return f"uniap plan: {plan.model.get('name', '?')} on {plan.cluster.get('name', '?')}"


def plan_digest(plan: Plan) -> str:
    """Short hash of what the plan decides (pipeline, stages, every layer's strategy): differs between two plans
    of one model, where the fingerprint (model and world size) does not."""
    body = plan.to_json()
    decided = {k: body[k] for k in ("pipeline", "stages", "layers", "workload")}
    return hashlib.sha256(json.dumps(decided, sort_keys=True).encode()).hexdigest()[:16]


def _html(plan: Plan, fig: Figures, measured: dict | None, images: dict[str, bytes]) -> str:
    e = html.escape
    pred = plan.predicted or {}
    pipe = plan.pipeline
    wl = plan.workload
    title = _title(plan)
    chunks = f" × {plan.virtual_stages} chunks" if plan.virtual_stages > 1 else ""
    idle = pred.get("bubble_fraction")
    idle_text = f"; predicted idle share {idle * 100:.1f}% (bubbles and sync)" if idle is not None else ""
    rows = [
        ("model", f"{plan.model.get('name')} — {len(plan.layers)} layers, "
                  f"{int(plan.model.get('parameters', 0)) / 1e9:.3f} B parameters, sequence {plan.model.get('seq_len')}"),
        ("cluster", f"{plan.cluster.get('name')} — {plan.cluster.get('nodes')} node(s) × "
                    f"{plan.cluster.get('devices_per_node')} device(s)"),
        ("workload", f"global batch {wl.get('global_batch')}, {wl.get('precision')}"),
        ("pipeline", f"{pipe['degree']} stage(s){chunks}, {pipe['micro_batches']} micro-batch(es), "
                     f"{pipe['schedule']}{idle_text}"),
        ("predicted iteration time", _fmt_time(fig.tpi)),
    ]
    if pred.get("samples_per_s") is not None:
        rows.append(("predicted throughput", f"{pred['samples_per_s']:.2f} samples/s, "
                                             f"{pred.get('tokens_per_s', 0):.0f} tokens/s"))
    if pred.get("mfu") is not None:
        rows.append(("predicted MFU", f"{pred['mfu'] * 100:.1f}%"))
    fits = fig.capacity is None or max(fig.memory) <= fig.capacity
    reserve = f" (device memory less a {_gb(fig.reserve)} framework reserve)" if fig.reserve else ""
    rows.append(("memory", f"peak {_gb(max(fig.memory))} of {_gb(fig.capacity)} usable per device{reserve} — "
                           + ("fits" if fits else "does NOT fit")))
    search = plan.search
    if search:
        gap = search.get("gap")
        if search.get("optimal"):
            state = "proven optimal"
        elif search.get("baseline"):
            state = "baseline planner (no optimality claim)"
        else:
            state = "gap " + (f"{gap * 100:.2f}%" if gap is not None else "unknown")
        rows.append(("search", f"{search.get('solver')}, {search.get('candidates')} candidate(s), "
                               f"{float(search.get('time_s', 0.0)):.2f} s, {state}"))
    if measured and measured.get("iteration_time_s") is not None:
        t = measured["iteration_time_s"]
        ratio = f" (measured / predicted = {t / fig.tpi:.2f})" if fig.tpi else ""
        rows.append(("measured iteration time", _fmt_time(t) + ratio))
    summary = "\n".join(f"<tr><th>{e(k)}</th><td>{e(str(v))}</td></tr>" for k, v in rows)

    from uniap.views import strategy_runs

    m = measured or {}
    head = ["stage", "ranks", "layers", "strategies", "predicted time/µbatch"]
    if m.get("stage_time_s") is not None:
        head.append("measured time/µbatch (step ÷ micro-batches)")
    head.append("predicted peak memory")
    if m.get("peak_memory_bytes") is not None:
        head.append("measured peak memory")
    body = []
    for stage in plan.stages:
        i = stage.index
        ranks = f"{stage.ranks[0]}–{stage.ranks[-1]}" if len(stage.ranks) > 1 else str(stage.ranks[0])
        cells = [str(i), ranks, ", ".join(f"{a}–{b}" for a, b in stage.ranges),
                 f"<pre>{e(strategy_runs(plan, i))}</pre>", _fmt_time(fig.p[i])]
        if m.get("stage_time_s") is not None:
            cells.append(_fmt_time(m["stage_time_s"][i]))
        over = fig.capacity is not None and fig.memory[i] > fig.capacity
        cells.append(("<span class=bad>" if over else "") + _gb(fig.memory[i]) + ("</span>" if over else ""))
        if m.get("peak_memory_bytes") is not None:
            cells.append(_gb(m["peak_memory_bytes"][i]))
        body.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    stage_table = ("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr>\n" + "\n".join(body)
                   + "</table>")

    def img(name: str, alt: str) -> str:
        data = base64.b64encode(images[name]).decode("ascii")
        return f'<img alt="{e(alt)}" src="data:image/svg+xml;base64,{data}">'

    note = f'<p class="note">{e(fig.note)}</p>' if fig.note else ""
    run_line = ", the solid orange one the run's" if m.get("iteration_time_s") is not None else ""
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{e(title)}</title><style>{CSS}</style></head>
<body>
<h1>{e(title)}</h1>
<table>{summary}</table>
{note}
<h2>Pipeline timeline</h2>
{img("timeline", "pipeline timeline")}
<p class="note">Built from the cost model's per-stage time p of one micro-batch (forward ≈ p/3, backward ≈ 2p/3,
recomputation inside the backward), the boundary send times (half for the activation, half for its gradient) and
each stage's once-per-iteration gradient sync and optimizer step, by simulating the {e(str(pipe['schedule']))}
order. Grey hatched: bubbles. The dashed line is the cost model's predicted iteration time{e(run_line)}. The
simulation runs each stage's own operation order, while the
predicted time is the cost model's formula, which charges the slowest stage for every micro-batch after the first
and every stage once: on unbalanced stages a sync bar can end a little before or after the dashed line.</p>
<h2>Strategy of each layer</h2>
{img("strategies", "per-layer strategy map")}
<p class="note">Strategy labels: dp<i>n</i> data parallel over <i>n</i> devices, tp<i>n</i> tensor parallel over
<i>n</i> (tp<i>n</i>sp with sequence parallelism), z1–z3 the ZeRO stage over the dp group (z3 = fully sharded,
FSDP), rc the layer's activations recomputed in backward; "single" one device. Joined by ·, e.g. dp8·tp2sp·z2.</p>
<h2>Stages</h2>
{stage_table}
{img("memory", "peak memory per stage")}
{img("stage-times", "stage time per micro-batch")}
<p class="note">Generated by uniap on {stamp}. Model fingerprint {e(plan.fingerprint)} (model and world size);
plan digest {e(plan_digest(plan))} (pipeline, stages and strategies).</p>
</body></html>
"""


def render_report(plan: Plan, out_html: Path, run: dict | None = None, png: Path | None = None, *,
                  cluster: ClusterSpec | str | None = None) -> Path:
    """Write a static HTML report of `plan` (and a one-page PNG if `png`); returns the HTML path.

    The plan is re-costed on `cluster` (default: the preset named in the plan). `run` is a run's result JSON
    ({"iteration_time_s", "stage_time_s": [...], "peak_memory_bytes": [...]}, per stage or per rank): its
    measured figures are shown beside the predicted ones.
    """
    if not isinstance(plan, Plan):
        raise UniapError("render_report needs a Plan")
    measured = check_run(run, plan)
    fig = recost(plan, cluster)
    images = panel_images(plan, fig, measured)
    out_html = Path(out_html)
    try:
        out_html.write_text(_html(plan, fig, measured, images), encoding="utf-8")
        if png is not None:
            Path(png).write_bytes(one_page_png(plan, fig, measured))
    except OSError as exc:
        raise UniapError(f"cannot write the report: {exc.strerror} ({exc.filename})") from None
    return out_html
