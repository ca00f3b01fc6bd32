"""`render_report`: one static HTML page (SVG figures embedded as base64, no scripts, no network) for a plan,
optionally with a run's measured figures beside the predicted ones and a second plan side by side."""

from __future__ import annotations

import base64
import html
import math
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from uniap.errors import UniapError
from uniap.jsonfile import digest
from uniap.plans import Plan
from uniap.report import figures
from uniap.report.timeline import Box, makespan, simulate
from uniap.spec.cluster import ClusterSpec
from uniap.views import layer_runs

MISMATCH = 0.02  # simulated timeline and predicted iteration time further apart than this: the report says so
HEADROOM = 0.03  # a plan that fits with less than this share of the device's memory left gets a word of caution


@dataclass(frozen=True)
class LayerFigures:
    """One layer under its chosen strategy, as the cost tables (`StageProgram`) price it, per device."""

    flops: float  # forward FLOPs of one micro-batch (all of its samples)
    params: int
    time: float  # seconds, forward + backward of one micro-batch (recomputation included)
    once: float  # seconds once per iteration (gradient sync, optimizer step)
    states: float  # bytes of model states (parameters, gradients, optimizer states)
    activations: float  # bytes of activations held at the stage's peak (`held` micro-batches)
    held: float  # micro-batches in flight at the peak, on this layer's chunk


@dataclass
class Figures:
    """What the report draws, per stage: predicted p (per micro-batch), o (boundaries), g (once), memory."""

    p: list[float]
    o: list[float]
    g: list[float]
    peak: list[float]  # peak bytes per device, framework reserve included
    device: float | None  # the device's memory in bytes
    tpi: float | None
    note: str = ""  # why the plan could not be re-costed (figures then come from the plan's `predicted`)
    chunk_p: list[float] | None = None  # per chunk, under the interleaved schedule (None: p per stage)
    chunk_w: list[float] | None = None  # per chunk, its weight pass, under a schedule that splits the backward
    reserve: float | None = None  # bytes per device kept for the framework (None: not known apart, inside `peak`)
    states: list[float] | None = None  # model-state bytes per device of each stage (None: not re-costed)
    activations: list[float] | None = None  # activation bytes per device of each stage at its peak
    layers: list[LayerFigures] | None = None

    @property
    def recosted(self) -> bool:
        return not self.note


def recost(plan: Plan, cluster: ClusterSpec | str | None = None) -> Figures:
    """Per-stage and per-layer figures by re-costing the plan (`estimate.cost_plan` + `solve.program.stage_times`),
    so the report shows the cost model's numbers; falls back to the plan's `predicted` section if that is
    impossible."""
    from uniap.estimate import as_planned, cost_plan, evaluate_unchecked, workload_of
    from uniap.solve.program import stage_times
    from uniap.spec.cluster import load_cluster
    from uniap.spec.families import build_layers

    try:
        model = build_layers(plan.model_config(), int(plan.model.seq_len))
        clus = cluster if isinstance(cluster, ClusterSpec) else load_cluster(cluster or str(plan.cluster.name))
        if not isinstance(cluster, ClusterSpec):  # the engine it runs under, as estimate --plan prices it
            clus = replace(clus, engine=plan.engine_or(clus.engine))
        if clus.devices != plan.world_size:
            raise UniapError(f"cluster {clus.name} has {clus.devices} devices, the plan {plan.world_size}")
        program, stage_of, strategy_of = cost_plan(plan, model, clus)
        program = as_planned(program, clus, stage_of, strategy_of)
        times = stage_times(program, stage_of, strategy_of)
    except UniapError as exc:
        return _from_plan_file(plan, exc)
    # model states alone: the same program holding no activations
    states = stage_times(replace(program, inflight=np.zeros_like(program.inflight), held=None), stage_of,
                         strategy_of).memory
    reserve = float(clus.device.reserve_bytes)
    micro = workload_of(plan).global_batch / int(plan.pipeline.micro_batches)
    layers = [LayerFigures(flops=spec.flops * micro, params=spec.params, time=float(program.A[u, k]),
                           once=float(program.G[u, k]), states=float(program.Ms[u, k]),
                           activations=float(program.Ma[u, k] * times.held[j]), held=float(times.held[j]))
              for u, (spec, j, k) in enumerate(zip(model.layers, stage_of, strategy_of))]
    return Figures(p=[float(x) for x in times.p], o=[float(x) for x in times.o], g=[float(x) for x in times.g],
                   peak=[float(m) + reserve for m in times.memory], device=float(clus.device.memory_bytes),
                   tpi=float(evaluate_unchecked(program, stage_of, strategy_of)), reserve=reserve,
                   chunk_p=[float(x) for x in times.chunk_p] if plan.virtual_stages > 1 else None,
                   chunk_w=None if times.chunk_w is None else [float(x) for x in times.chunk_w],
                   states=[float(x) for x in states], activations=[float(m - s) for m, s in zip(times.memory, states)],
                   layers=layers)


def _from_plan_file(plan: Plan, why: UniapError) -> Figures:
    pred = plan.predicted or {}
    P, v = len(plan.stages), plan.virtual_stages
    p = [float(x) for x in pred.get("stage_time_s", [])]
    if len(p) != P:
        raise UniapError(f"cannot re-cost the plan ({why}) and its predicted section has no stage times") from None
    peak = [float(x) for x in pred.get("peak_memory_bytes", [])]  # the framework reserve included
    device = pred.get("memory_capacity_bytes")  # the whole device (what `predict` writes)
    return Figures(p=p, o=[0.0] * (P * v - 1), g=[0.0] * P,
                   chunk_p=[p[plan.schedule.stage_of_chunk(j, P)] / v for j in range(P * v)]
                   if v > 1 else None,
                   peak=peak if len(peak) == P else [0.0] * P, device=float(device) if device else None,
                   tpi=pred.get("iteration_time_s"),
                   note=f"not re-costed ({why}): stage times from the plan file, sends and sync not shown, "
                        "chunks drawn as equal shares of their stage, no per-layer figures; memory as the plan file "
                        "gives it (framework reserve included, not known apart)")


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
    c = int(plan.pipeline.micro_batches)  # a run's stage time adds up every micro-batch of a step
    return {"iteration_time_s": None if t is None else float(t),
            "stage_time_s": None if per_step is None else [x / c for x in per_step],
            "peak_memory_bytes": _per_stage(run.get("peak_memory_bytes"), plan, "peak_memory_bytes")}


def timeline_boxes(plan: Plan, fig: Figures) -> list[Box]:
    return simulate(str(plan.pipeline.schedule), fig.chunk_p or fig.p, fig.o, fig.g,
                    int(plan.pipeline.micro_batches), plan.virtual_stages, fig.chunk_w)


def _panels(plan: Plan, fig: Figures, measured: dict | None, boxes: list[Box]):
    """(name, draw(figure, slot)) of every panel."""
    P, c, schedule = len(plan.stages), int(plan.pipeline.micro_batches), str(plan.pipeline.schedule)
    stage_of = np.array([layer.position for layer in plan.layers])  # chunk boundaries under interleaving
    labels = [layer.strategy.label() for layer in plan.layers]
    names = [layer.name for layer in plan.layers]
    m = measured or {}
    return [
        ("timeline", lambda f, slot: figures.draw_timeline(f, slot, boxes, P, schedule, c, fig.tpi,
                                                           plan.virtual_stages, m.get("iteration_time_s"))),
        ("strategies", lambda f, slot: figures.draw_strategy_map(f, slot, stage_of, labels, names, P)),
        ("memory", lambda f, slot: figures.draw_memory(f, slot, fig.peak, fig.device, fig.reserve, fig.states,
                                                       fig.activations, m.get("peak_memory_bytes"))),
        ("stage-times", lambda f, slot: figures.draw_stage_times(f, slot, fig.p, m.get("stage_time_s"),
                                                                 _by_position(plan, fig.chunk_p))),
    ]


def _by_position(plan: Plan, chunk_p: list[float] | None) -> list[list[float]] | None:
    """Per chunk position k, per stage: the time of the stage's k-th chunk (None without chunks)."""
    if chunk_p is None:
        return None
    P, placed = len(plan.stages), plan.schedule
    return [[chunk_p[placed.chunk_at(d, k, P)] for d in range(P)] for k in range(plan.virtual_stages)]


def _timeline_height(P: int, boxes: list[Box], c: int) -> float:
    windows = len(figures.timeline_windows(boxes, P, c))
    return windows * (1.2 + (0.45 if P <= 8 else 0.3) * P) + figures.WINDOW_GAP * (windows - 1)


def panel_images(plan: Plan, fig: Figures, measured: dict | None = None,
                 boxes: list[Box] | None = None) -> dict[str, bytes]:
    """Each panel as its own SVG."""
    boxes = timeline_boxes(plan, fig) if boxes is None else boxes
    sizes = {"timeline": (11.0, _timeline_height(len(plan.stages), boxes, int(plan.pipeline.micro_batches))),
             "strategies": (11.0, 2.6), "memory": (5.4, 3.2), "stage-times": (5.4, 3.2)}
    out = {}
    for name, draw in _panels(plan, fig, measured, boxes):
        f = figures.new_figure(*sizes[name])
        draw(f, f.add_gridspec(1, 1)[0, 0])
        out[name] = figures.svg_bytes(f)
    return out


def one_page_png(plan: Plan, fig: Figures, measured: dict | None = None, boxes: list[Box] | None = None) -> bytes:
    """All panels on one page: timeline, strategy map, then memory and stage times side by side."""
    boxes = timeline_boxes(plan, fig) if boxes is None else boxes
    top = _timeline_height(len(plan.stages), boxes, int(plan.pipeline.micro_batches))
    f = figures.new_figure(11.0, top + 2.8 + 3.4)
    f.suptitle(_title(plan), fontsize=11, fontweight="bold")
    warning = mismatch_headline(fig, boxes)
    if warning is not None:  # the HTML's warning, on the page that may travel without it
        inch = 1.0 / f.get_figheight()
        f.text(0.5, 1.0 + 0.1 * inch, f"Predicted and simulated time disagree: {warning}.", ha="center",
               va="bottom", fontsize=9, color="#b00020", fontweight="bold")
    grid = f.add_gridspec(3, 2, height_ratios=[top, 2.4, 3.2], hspace=0.7, wspace=0.3)
    panels = dict(_panels(plan, fig, measured, boxes))
    panels["timeline"](f, grid[0, :])
    panels["strategies"](f, grid[1, :])
    panels["memory"](f, grid[2, 0])
    panels["stage-times"](f, grid[2, 1])
    return figures.png_bytes(f)


def _fmt_time(seconds) -> str:
    if seconds is None or not isinstance(seconds, (int, float)) or not math.isfinite(seconds):
        return "—"
    if seconds >= 1:
        return f"{seconds:.3f} s"
    return f"{seconds * 1e3:.2f} ms" if seconds >= 1e-3 or seconds == 0 else f"{seconds * 1e6:.1f} µs"


def _bytes(nbytes) -> str:
    if nbytes is None:
        return "—"
    if nbytes >= 1e9:
        return f"{nbytes / 1e9:.2f} GB"
    return f"{nbytes / 1e6:.1f} MB" if nbytes >= 1e6 or nbytes == 0 else f"{nbytes / 1e3:.1f} kB"


def _count(n: float, unit: str = "", giga: str = "G") -> str:
    """A count with a metric prefix, e.g. 1.03 T, 124 M, 12.3 k, and `giga` for 10⁹ (B for parameters)."""
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, giga), (1e6, "M"), (1e3, "k")):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {prefix}{unit}"
    return f"{n:.0f} {unit}".rstrip()


def _parameters(n: float) -> str:
    return _count(n, giga="B")


def _percent(ratio: float) -> str:
    return f"{ratio * 100:+.1f} %"


CSS = """body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em auto;max-width:1100px;
color:#222;padding:0 1em}h1{font-size:1.5em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.9em}td,th{border:1px solid #ddd;padding:.25em .6em;text-align:left;
vertical-align:top}th{background:#f5f5f5}td.n{text-align:right;white-space:nowrap}
img{max-width:100%;height:auto;display:block;margin:.5em 0}.note{color:#666;font-size:.85em}.bad{color:#b00}
pre{margin:0;font-family:inherit;white-space:pre-wrap}pre.nw{white-space:pre}
.row{display:flex;gap:1em}.row img{width:50%;min-width:0}
.warn{border-left:4px solid #c60;background:#fff6e5;padding:.5em .8em}summary{cursor:pointer;margin:.6em 0}"""


def _title(plan: Plan) -> str:
    return f"uniap plan: {plan.model.name} on {plan.cluster.name}"


def plan_digest(plan: Plan) -> str:
    """Short hash of what the plan decides (pipeline, stages, every layer's strategy): differs between two plans
    of one model, where the fingerprint (model and world size) does not."""
    body = plan.to_json()
    decided = {k: body[k] for k in ("pipeline", "stages", "layers", "workload")}
    return digest(decided)


def simulated_ratio(fig: Figures, boxes: list[Box]) -> tuple[float, float] | None:
    """(simulated makespan, its ratio to the predicted iteration time), or None when the two cannot be compared:
    the plan was not re-costed (its timeline then lacks sends and sync) or has no finite prediction."""
    if not fig.recosted or not fig.tpi or not math.isfinite(fig.tpi):
        return None
    simulated = makespan(boxes)
    return simulated, simulated / fig.tpi


def mismatch(fig: Figures, boxes: list[Box]) -> str | None:
    """A warning, in numbers, when the simulated timeline and the predicted iteration time differ by more than
    `MISMATCH`; None when they agree or cannot be compared."""
    headline = mismatch_headline(fig, boxes)
    if headline is None:
        return None
    return (f"{headline} ({_percent(simulated_ratio(fig, boxes)[1] - 1)}; the two agree within ±{MISMATCH * 100:.0f} % when chunks "
            "and stages are balanced). The predicted time is the cost model's formula, the one the planner "
            "optimises; the simulation runs each stage's operations in the schedule's order. Treat the predicted "
            "time and the figures derived from it (throughput, MFU) with that margin.")


def mismatch_headline(fig: Figures, boxes: list[Box]) -> str | None:
    """The warning's first sentence, the one-page PNG's banner: None when the two agree or cannot be compared."""
    compared = simulated_ratio(fig, boxes)
    if compared is None or abs(compared[1] - 1) <= MISMATCH:
        return None
    simulated, ratio = compared
    return (f"The simulated timeline takes {_fmt_time(simulated)}, {ratio:.3f}× the predicted iteration time of "
            f"{_fmt_time(fig.tpi)}")


def _memory_line(fig: Figures) -> str:
    """Peak memory against the device, the reserve on the same side as the plan, and the headroom left."""
    if not fig.device:
        return f"peak {_bytes(max(fig.peak))} per device (device memory unknown)"
    i = int(np.argmax(fig.peak))
    peak, left = fig.peak[i], fig.device - fig.peak[i]
    parts = f"peak {_bytes(peak)} of {_bytes(fig.device)} device memory"
    if fig.states is not None and fig.reserve is not None:
        parts += (f" (stage {i}: {_bytes(fig.states[i])} model states + {_bytes(fig.activations[i])} activations "
                  f"+ {_bytes(fig.reserve)} framework reserve)")
    else:
        parts += " (as the plan file gives it, framework reserve included)"
    if left < 0:
        return parts + f" — does NOT fit: {_bytes(-left)} over"
    if left < HEADROOM * fig.device:
        return parts + (f" — fits, with only {_bytes(left)} ({left / fig.device * 100:.2f} %) headroom: the memory "
                        "estimate must be right to within that, or the run may run out of memory")
    return parts + f" — fits, {_bytes(left)} ({left / fig.device * 100:.0f} %) headroom"


def _summary(plan: Plan, fig: Figures, boxes: list[Box], measured: dict | None) -> list[tuple[str, str]]:
    pred = plan.predicted or {}
    pipe, wl = plan.pipeline, plan.workload
    chunks = f" × {plan.virtual_stages} chunks" if plan.virtual_stages > 1 else ""
    idle = pred.get("bubble_fraction")
    idle_text = f"; predicted idle share {idle * 100:.1f}% (bubbles and sync)" if idle is not None else ""
    rows = [
        ("model", f"{plan.model.name} — {len(plan.layers)} layers, "
                  f"{_parameters(int(plan.model.parameters))} parameters, "
                  f"sequence {plan.model.seq_len}"),
        ("cluster", f"{plan.cluster.name} — {plan.cluster.nodes} node(s) × "
                    f"{plan.cluster.devices_per_node} device(s)"),
        ("workload", f"global batch {wl.global_batch}, {wl.precision}"),
        ("pipeline", f"{pipe.degree} stage(s){chunks}, {pipe.micro_batches} micro-batch(es), "
                     f"{pipe.schedule}{idle_text}"),
        ("predicted iteration time", _fmt_time(fig.tpi)),
    ]
    compared = simulated_ratio(fig, boxes)
    if compared is not None:
        rows.append(("simulated timeline", f"{_fmt_time(compared[0])} ({compared[1]:.3f}× predicted)"))
    if pred.get("samples_per_s") is not None:
        rows.append(("predicted throughput", f"{pred['samples_per_s']:.2f} samples/s, "
                                             f"{pred.get('tokens_per_s', 0):.0f} tokens/s"))
    if pred.get("mfu") is not None:
        rows.append(("predicted MFU", f"{pred['mfu'] * 100:.1f}%"))
    rows.append(("memory", _memory_line(fig)))
    search = plan.search
    if search:
        gap = search.get("gap")
        if search.get("optimal"):
            state = "proven optimal (under the cost model's formula)"
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
    return rows


def _table(head: list[str], rows: list[list[str]], numeric: set[int] = frozenset()) -> str:
    """An HTML table; `rows` hold HTML already escaped."""
    e = html.escape
    top = "<tr>" + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr>"
    body = ["<tr>" + "".join(f"<td class=n>{c}</td>" if k in numeric else f"<td>{c}</td>" for k, c in enumerate(row))
            + "</tr>" for row in rows]
    return "<table>" + top + "\n" + "\n".join(body) + "</table>"


def _span(plan: Plan, first: int, last: int) -> str:
    """Layers first..last by name: "embed", "block.0–block.11"."""
    a, b = plan.layers[first].name, plan.layers[last].name
    return a if first == last else f"{a}–{b}"


def _strategies(plan: Plan, stage: int) -> str:
    """A stage's strategies, each once with the layers it covers (named as the layers column names them)."""
    runs = layer_runs(plan, stage)
    by: dict[str, list[tuple[str, int]]] = {}
    for names, strategy, count in runs:
        by.setdefault(strategy.label(), []).append((names, count))
    if len(by) == 1:
        (label, members), = by.items()
        total = sum(n for _, n in members)
        return f"{label} (all {total} layer{'s' if total > 1 else ''})"
    return "\n".join(f"{label}: " + ", ".join(names for names, _ in members) for label, members in by.items())


def _stage_table(plan: Plan, fig: Figures, measured: dict) -> str:
    e = html.escape
    P, v = len(plan.stages), plan.virtual_stages
    head = ["stage", "ranks", "layers" if v == 1 else "chunks: layers, forward + backward per micro-batch",
            "strategies", "forward + backward of one micro-batch (predicted)"]
    if measured.get("stage_time_s") is not None:
        head.append("measured, per micro-batch (the run's stage step time ÷ micro-batches)")
    split = fig.states is not None and fig.reserve is not None
    head += ["model states", "activations (at the peak)", "framework reserve"] if split else []
    head.append("peak memory per device" + ("" if split else " (reserve included)"))
    if measured.get("peak_memory_bytes") is not None:
        head.append("measured peak memory")
    rows = []
    for stage in plan.stages:
        i = stage.index
        ranks = f"{stage.ranks[0]}–{stage.ranks[-1]}" if len(stage.ranks) > 1 else str(stage.ranks[0])
        if v == 1:
            layers = f"<pre class=nw>{e(_span(plan, *stage.ranges[0]))}</pre>"
        else:
            chunk = [plan.schedule.chunk_at(i, k, P) for k in range(v)]
            layers = "<pre class=nw>" + "\n".join(
                f"c{chunk[k]}: {e(_span(plan, a, b))}, {_fmt_time(fig.chunk_p[chunk[k]])}"
                for k, (a, b) in enumerate(stage.ranges)) + "</pre>"
        cells = [str(i), ranks, layers, f"<pre>{e(_strategies(plan, i))}</pre>", _fmt_time(fig.p[i])]
        if measured.get("stage_time_s") is not None:
            cells.append(_fmt_time(measured["stage_time_s"][i]))
        if split:
            cells += [_bytes(fig.states[i]), _bytes(fig.activations[i]), _bytes(fig.reserve)]
        over = fig.device is not None and fig.peak[i] > fig.device
        cells.append(("<span class=bad>" if over else "") + _bytes(fig.peak[i]) + ("</span>" if over else ""))
        if measured.get("peak_memory_bytes") is not None:
            cells.append(_bytes(measured["peak_memory_bytes"][i]))
        rows.append(cells)
    return _table(head, rows, {1} | set(range(4, len(head))))


def _layer_table(plan: Plan, fig: Figures) -> str:
    if fig.layers is None:
        return '<p class="note">No per-layer figures: the plan could not be re-costed.</p>'
    e = html.escape
    chunked = plan.virtual_stages > 1
    head = ["layer", "stage" + (" · chunk" if chunked else ""), "strategy", "parameters",
            "forward FLOPs per micro-batch", "forward + backward per micro-batch",
            "once per iteration (sync, optimizer)",
            "model states per device", "activations per device (held at the peak)"]
    rows = []
    for layer, f in zip(plan.layers, fig.layers):
        where = f"{layer.stage} · c{layer.position}" if chunked else str(layer.stage)
        rows.append([e(layer.name), where, e(layer.strategy.label()), _parameters(f.params), _count(f.flops, "FLOP"),
                     _fmt_time(f.time), _fmt_time(f.once), _bytes(f.states),
                     f"{_bytes(f.activations)} ({f.held:g} micro-batch{'es' if f.held != 1 else ''})"])
    return _table(head, rows, {1} | set(range(3, len(head)))) + (
        '<p class="note">Per device of the layer\'s stage, as the cost tables price it. A chunk\'s time is its '
        "layers' times plus the resharding between them; the framework reserve "
        f"({_bytes(fig.reserve)}) is per device, not per layer.</p>")


def _comparison(plan: Plan, fig: Figures, boxes: list[Box], other: Plan, other_fig: Figures,
                other_boxes: list[Box]) -> str:
    """Two plans' summary numbers side by side, with B / A where they are numbers."""
    e = html.escape

    def numbers(p: Plan, f: Figures, b: list[Box]) -> dict[str, tuple[str, float | None]]:
        pred = p.predicted or {}
        pipe = p.pipeline
        chunks = f"·v{p.virtual_stages}" if p.virtual_stages > 1 else ""
        compared = simulated_ratio(f, b)
        simulated = None if compared is None else compared[0]
        samples = pred.get("samples_per_s")
        return {
            "model": (f"{p.model.name}, sequence {p.model.seq_len}", None),
            "cluster": (f"{p.cluster.name} ({p.world_size} devices)", None),
            "pipeline": (f"pp{pipe.degree}{chunks}, c = {pipe.micro_batches}, {pipe.schedule}", None),
            "strategies": (", ".join(dict.fromkeys(layer.strategy.label() for layer in p.layers)), None),
            "predicted iteration time": (_fmt_time(f.tpi), f.tpi),
            "simulated timeline": (_fmt_time(simulated), simulated),
            "predicted throughput (samples/s)": ("—" if samples is None else f"{samples:.2f}", samples),
            "predicted MFU": ("—" if pred.get("mfu") is None else f"{pred['mfu'] * 100:.1f}%", pred.get("mfu")),
            "peak memory per device": (_bytes(max(f.peak)), max(f.peak)),
            "plan digest": (plan_digest(p), None),
        }

    a, b = numbers(plan, fig, boxes), numbers(other, other_fig, other_boxes)
    rows = []
    for key in a:
        (ta, va), (tb, vb) = a[key], b[key]
        ratio = f"{vb / va:.3f}×" if va and vb is not None else ""
        rows.append([e(key), e(ta), e(tb), ratio])
    same = "" if plan.fingerprint == other.fingerprint else \
        '<p class="note">The two plans are for different models or world sizes (their fingerprints differ).</p>'
    return _table(["", "this plan (A)", "the other plan (B)", "B / A"], rows, {3}) + same


def _html(plan: Plan, fig: Figures, measured: dict | None, images: dict[str, bytes], boxes: list[Box],
          against: tuple[Plan, Figures, list[Box]] | None = None) -> str:
    e = html.escape
    title = _title(plan)
    summary = "\n".join(f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in _summary(plan, fig, boxes, measured))
    m = measured or {}

    def img(name: str, alt: str) -> str:
        data = base64.b64encode(images[name]).decode("ascii")
        return f'<img alt="{e(alt)}" src="data:image/svg+xml;base64,{data}">'

    warning = mismatch(fig, boxes)
    warning = f'<p class="warn"><b>Predicted and simulated time disagree.</b> {e(warning)}</p>' if warning else ""
    note = f'<p class="note">{e(fig.note)}</p>' if fig.note else ""
    side = f"<h2>Side by side with {e(_title(against[0]))}</h2>\n{_comparison(plan, fig, boxes, *against)}" \
        if against else ""
    run_line = ", the solid orange one the run's" if m.get("iteration_time_s") is not None else ""
    run_memory = " A measured peak is what the run's allocator reports." if m.get("peak_memory_bytes") else ""
    compared = simulated_ratio(fig, boxes)
    if compared is not None:
        agree = (f"Here the simulation ends at {_fmt_time(compared[0])}, {_percent(compared[1] - 1)} from the "
                 "predicted time.")
    else:
        agree = "Without the plan's sends and sync the simulation is not compared with the predicted time."
    chunk_line = (" Under interleaving a stage's chunks are shaded from its colour (its first chunk) to a lighter one "
                  "(its last); the legend shows the key.") if plan.virtual_stages > 1 else ""
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{e(title)}</title><style>{CSS}</style></head>
<body>
<h1>{e(title)}</h1>
{warning}
<table>{summary}</table>
{note}
{side}
<h2>Pipeline timeline</h2>
{img("timeline", "pipeline timeline")}
<p class="note">Built from the cost model's time p of one micro-batch per stage (per chunk under interleaving;
forward ≈ p/3, backward ≈ 2p/3, recomputation inside the backward), the boundary send times (half for the
activation, half for its gradient) and each stage's once-per-iteration gradient sync and optimizer step, by
simulating the {e(str(plan.pipeline.schedule))} order. Grey hatched: idle time (bubbles).{chunk_line} The
dashed line is the cost model's predicted iteration time{e(run_line)}. The simulation runs each stage's own
operation order, while the predicted time is the cost model's formula: they agree closely on balanced stages and
chunks. {e(agree)} A pipeline of more than {figures.COLLAPSE_ABOVE} forward and backward boxes is drawn as its fill
and its drain, the steady state between them left out; sends are drawn at least a pixel wide.</p>
<h2>Strategy of each layer</h2>
{img("strategies", "per-layer strategy map")}
<p class="note">Strategy labels: dp<i>n</i> data parallel over <i>n</i> devices, tp<i>n</i> tensor parallel over
<i>n</i> (tp<i>n</i>sp with sequence parallelism), z1–z3 the ZeRO stage over the dp group (z3 = fully sharded,
FSDP), rc the layer's activations recomputed in backward; "single" one device. Joined by ·, e.g. dp8·tp2sp·z2.</p>
<h2>Stages</h2>
{_stage_table(plan, fig, m)}
<p class="note">Times are per micro-batch (one forward and one backward through the stage's layers, resharding
between them included), not per iteration. Memory is per device: model states (parameters, gradients, optimizer
states), the activations the stage holds at its peak, and the framework reserve the cost model keeps
aside.{e(run_memory)}</p>
<div class="row">{img("memory", "peak memory per stage")}{img("stage-times", "stage time per micro-batch")}</div>
<h2>Layers</h2>
<details><summary>Per-layer figures under the chosen strategies ({len(plan.layers)} layers)</summary>
{_layer_table(plan, fig)}
</details>
<p class="note">Generated by uniap on {stamp}. Model fingerprint {e(plan.fingerprint)} (model and world size);
plan digest {e(plan_digest(plan))} (pipeline, stages and strategies).</p>
</body></html>
"""


def report_html(plan: Plan, fig: Figures, measured: dict | None = None,
                against: tuple[Plan, Figures] | None = None) -> str:
    """The page for `plan` priced as `fig` (`recost`), with a run's measured figures (`check_run`) and another
    plan and its figures side by side."""
    boxes = timeline_boxes(plan, fig)
    other = None if against is None else (*against, timeline_boxes(*against))
    return _html(plan, fig, measured, panel_images(plan, fig, measured, boxes), boxes, other)


def render_report(plan: Plan, out_html: Path, run: dict | None = None, png: Path | None = None, *,
                  cluster: ClusterSpec | str | None = None, against: Plan | None = None) -> Path:
    """Write a static HTML report of `plan` (and a one-page PNG if `png`); returns the HTML path.

    The plan is re-costed on `cluster` (default: the preset named in the plan). `run` is a run's result JSON
    ({"iteration_time_s", "stage_time_s": [...], "peak_memory_bytes": [...]}, per stage or per rank): its
    measured figures are shown beside the predicted ones. `against`: a second plan (re-costed on its own
    cluster), its summary shown side by side.
    """
    if not isinstance(plan, Plan) or (against is not None and not isinstance(against, Plan)):
        raise UniapError("render_report needs a Plan")
    measured = check_run(run, plan)
    fig = recost(plan, cluster)
    page = report_html(plan, fig, measured, None if against is None else (against, recost(against)))
    out_html = Path(out_html)
    try:
        out_html.write_text(page, encoding="utf-8")
        if png is not None:
            Path(png).write_bytes(one_page_png(plan, fig, measured))
    except OSError as exc:
        raise UniapError(f"cannot write the report: {exc.strerror} ({exc.filename})") from None
    return out_html
