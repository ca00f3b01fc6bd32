"""The report tells the truth and stays readable: the mismatch warning, large pipelines collapsed, keys and
labels that do not collide, memory in sensible units with its headroom, formatting, text as text, per-chunk and
per-layer figures, two plans side by side."""

import base64
import re
from dataclasses import replace
from xml.etree import ElementTree

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from uniap.commands.report import report_command
from uniap.errors import UniapError
from uniap.estimate import estimate_uniform
from uniap.report import figures, recost
from uniap.report.render import (_count, _memory_line, _parameters, _span, mismatch, one_page_png, report_html,
                                 timeline_boxes)
from uniap.report.timeline import makespan, simulate
from uniap.spec import load_model
from uniap.spec.cluster import load_cluster
from uniap.spec.workload import Workload

SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def gpt2():
    return load_model("gpt2")


@pytest.fixture(scope="module")
def plan(gpt2):
    return estimate_uniform(gpt2, load_cluster("a100-40g:1x4"), Workload(16, gpt2.seq_len, "bf16"), tp=2, pp=2,
                            micro_batches=4, recompute=True)


@pytest.fixture(scope="module")
def interleaved(gpt2):
    return estimate_uniform(gpt2, load_cluster("a100-40g:1x4"), Workload(16, gpt2.seq_len, "bf16"), pp=2, dp=2,
                            micro_batches=4, schedule="interleaved-1f1b", virtual_stages=2)


def _svgs(page):
    found = re.findall(r'src="data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)"', page)
    return [ElementTree.fromstring(base64.b64decode(x)) for x in found]


def _warning(page):
    found = re.search(r'<p class="warn">(.*?)</p>', page, re.S)
    return found.group(1) if found else None


def test_mismatch_warning_appears_in_numbers_only_when_the_timeline_disagrees(plan, interleaved):
    fig = recost(plan)  # a 1F1B plan: the timeline ends where the formula says
    assert makespan(timeline_boxes(plan, fig)) == pytest.approx(fig.tpi, rel=0.02)
    assert _warning(report_html(plan, fig)) is None
    # the interleaved plan with one chunk made 8× longer and its prediction kept: a mismatch we control
    fig = recost(interleaved)
    chunks = [x * (8 if j == 0 else 1) for j, x in enumerate(fig.chunk_p)]
    skewed = replace(fig, chunk_p=chunks)
    simulated = makespan(timeline_boxes(interleaved, skewed))
    assert simulated > fig.tpi * 1.02
    page = report_html(interleaved, skewed)
    text = _warning(page)
    assert text is not None and page.index('class="warn"') < page.index("<table>")  # at the top
    assert f"{simulated / fig.tpi:.3f}×" in text and f"{simulated * 1e3:.2f} ms" in text  # a 4-micro-batch gpt2
    assert f"{(simulated / fig.tpi - 1) * 100:+.1f} %" in text
    # within 2 %: no warning; a prediction 3 % too long: a warning (the other direction)
    assert mismatch(replace(skewed, tpi=simulated * 1.019), timeline_boxes(interleaved, skewed)) is None
    assert "0.971×" in mismatch(replace(skewed, tpi=simulated * 1.03), timeline_boxes(interleaved, skewed))
    # a plan that could not be re-costed has no sends and sync to compare with: no claim either way
    assert mismatch(replace(skewed, note="not re-costed"), timeline_boxes(interleaved, skewed)) is None


def test_one_page_png_carries_the_warning_too(plan, interleaved, monkeypatch):
    """The PNG may travel without the HTML: it opens with the same numbers when the two disagree."""
    drawn = []
    monkeypatch.setattr(figures, "png_bytes", lambda f: drawn.append(f) or b"")

    def banner(p, fig):
        one_page_png(p, fig)
        return [t.get_text() for t in drawn.pop().texts if "disagree" in t.get_text()]

    assert banner(plan, recost(plan)) == []
    fig = recost(interleaved)
    skewed = replace(fig, chunk_p=[x * (8 if j == 0 else 1) for j, x in enumerate(fig.chunk_p)])
    simulated = makespan(timeline_boxes(interleaved, skewed))
    (text,) = banner(interleaved, skewed)
    assert f"{simulated / fig.tpi:.3f}×" in text and mismatch(skewed, timeline_boxes(interleaved, skewed)).startswith(
        text.split(": ", 1)[1].rstrip("."))


def test_large_pipelines_draw_fill_and_drain_only():
    P, v, c = 16, 8, 64  # 16 384 forward and backward boxes
    S = P * v
    boxes = simulate("interleaved-1f1b", [1.0] * S, [0.01] * (S - 1), [0.5] * P, c, v)
    (lo, fill), (drain, hi) = figures.timeline_windows(boxes, P, c)
    assert lo == 0 and hi == makespan(boxes) and 0 < fill < drain < hi
    assert (fill + hi - drain) / hi < 0.4  # most of the steady state is left out
    small = simulate("1f1b", [1.0] * 4, [0.0] * 3, [0.0] * 4, 8)
    assert figures.timeline_windows(small, 4, 8) == [(0.0, makespan(small))]
    f = figures.new_figure(11, 12)
    axes = figures.draw_timeline(f, f.add_gridspec(1, 1)[0, 0], boxes, P, "interleaved-1f1b", c, makespan(boxes), v)
    assert len(axes) == 2 and "not drawn" in axes[1].get_title()
    svg = figures.svg_bytes(f)
    assert len(svg) < 500_000  # 16 384 boxes: the whole iteration drawn made 9.6 MB of one 1T page


def test_big_interleaved_report_stays_small(gpt2):
    big = estimate_uniform(gpt2, load_cluster("a100-40g:1x4"), Workload(64, gpt2.seq_len, "bf16"), pp=4, dp=1,
                           micro_batches=64, schedule="interleaved-1f1b", virtual_stages=3)
    fig = recost(big)
    assert sum(b.kind in ("forward", "backward") for b in timeline_boxes(big, fig)) > figures.COLLAPSE_ABOVE
    page = report_html(big, fig)
    timeline = " ".join("".join(t.itertext()) for t in _svgs(page)[0].iter(SVG + "text"))
    assert len(page) < 400_000 and "not drawn" in timeline


def test_chunk_shading_has_a_key_and_text_stays_text(interleaved):
    fig = recost(interleaved)
    f = figures.new_figure(11, 3)
    ax, = figures.draw_timeline(f, f.add_gridspec(1, 1)[0, 0], timeline_boxes(interleaved, fig), 2,
                                "interleaved-1f1b", 4, fig.tpi, 2)
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "1st chunk of a stage" in labels and "2nd chunk of a stage" in labels
    assert figures.chunk_keys(8) == [0, 3, 7]
    page = report_html(interleaved, fig)
    for svg in _svgs(page):  # Ctrl-F finds the figures' words
        texts = " ".join("".join(t.itertext()) for t in svg.iter(SVG + "text"))
        assert texts.strip()
    timeline = " ".join("".join(t.itertext()) for t in _svgs(page)[0].iter(SVG + "text"))
    assert "stage 1" in timeline and "1st chunk of a stage" in timeline


def _overlaps(texts, renderer) -> bool:
    boxes = sorted((t.get_window_extent(renderer) for t in texts if t.get_text()), key=lambda b: b.x0)
    return any(a.x1 > b.x0 for a, b in zip(boxes, boxes[1:]))


def test_strategy_map_chunk_labels_and_16_stage_bar_labels_do_not_collide():
    L, S, P = 130, 128, 16
    stage_of = np.minimum(np.arange(L) * S // L, S - 1)
    f = figures.new_figure(11, 2.6)
    ax = figures.draw_strategy_map(f, f.add_gridspec(1, 1)[0, 0], stage_of, ["dp8"] * L,
                                   [f"block.{u}" for u in range(L)], P)
    renderer = f.canvas.get_renderer()
    chunk_labels = [t for t in ax.texts if "·s" in t.get_text()]
    assert chunk_labels and not _overlaps(chunk_labels, renderer)
    for draw in (lambda f, slot: figures.draw_stage_times(f, slot, [0.5] * P),
                 lambda f, slot: figures.draw_memory(f, slot, [60e9] * P, 85.9e9, 2.1e9, [30e9] * P, [27.9e9] * P)):
        f = figures.new_figure(5.4, 3.2)
        ax = draw(f, f.add_gridspec(1, 1)[0, 0])
        f.canvas.draw()
        assert not _overlaps(ax.get_xticklabels(), f.canvas.get_renderer())


def test_memory_panel_units_reserve_and_headroom(plan, tmp_path):
    f = figures.new_figure(5.4, 3.2)  # a 12 MB run on a 40 GB device: an MB axis, the device named, not drawn
    ax = figures.draw_memory(f, f.add_gridspec(1, 1)[0, 0], [12e6, 11e6], 40e9, None)
    assert ax.get_ylabel() == "MB per device" and ax.get_ylim()[1] < 100 and "far above" in ax.get_title()
    # re-costed, 12 MB on a CPU device: the bars still in MB, the reserve left out of them and out of the limit
    ax = figures.draw_memory(f, f.add_gridspec(1, 1)[0, 0], [0.5e9 + 12e6], 2e9, 0.5e9, [8e6], [4e6])
    assert ax.get_ylabel() == "MB per device" and ax.get_ylim()[1] < 100
    assert "device memory less the 500 MB framework reserve: 1,500 MB" in ax.get_title()
    f = figures.new_figure(5.4, 3.2)  # nearly full: the limit drawn at device − reserve, named so
    ax = figures.draw_memory(f, f.add_gridspec(1, 1)[0, 0], [85.86e9], 85.9e9, 2.15e9, [40e9], [43.71e9])
    limit, = ax.get_lines()
    assert limit.get_ydata()[0] == pytest.approx(83.75)
    assert "device memory less the 2.15 GB framework reserve" in [t.get_text() for t in ax.get_legend().get_texts()]
    fig = recost(plan)  # re-costed: model states + activations + reserve = peak, against the whole device
    assert fig.device == load_cluster("a100-40g:1x4").device.memory_bytes
    for i in range(2):
        assert fig.states[i] + fig.activations[i] + fig.reserve == pytest.approx(fig.peak[i])
    assert fig.peak == pytest.approx(plan.predicted["peak_memory_bytes"], abs=1)
    recosted_page = report_html(plan, fig)
    assert "usable" not in recosted_page and "framework reserve" in recosted_page
    other = replace(plan, cluster=replace(plan.cluster, name="my-yaml-cluster"))
    fallback = recost(other)  # from the plan file: the reserve inside the peak, both against the whole device
    assert fallback.peak == pytest.approx(fig.peak, abs=1) and fallback.device == fig.device
    assert fallback.reserve is None and fallback.states is None
    page = report_html(other, fallback)
    assert "usable" not in page and "framework reserve included" in page
    tight = replace(fig, peak=[fig.device - 40e6] * 2)  # 83.71 of 83.75: fits, but say how little is left
    assert "fits, with only 40.0 MB (0.09 %) headroom" in _memory_line(tight)
    assert "does NOT fit: 1.00 GB over" in _memory_line(replace(fig, peak=[fig.device + 1e9] * 2))
    assert re.search(r"<th>memory</th><td>[^<]*fits, [0-9.]+ GB \(9\d %\) headroom</td>", recosted_page)


def test_formatting_ranges_units_labels_and_layer_names(plan, interleaved):
    page = report_html(interleaved, recost(interleaved))
    assert not re.search(r"\b(\d+)–\1\b", page)  # no "0–0" ranges
    assert _span(plan, 0, 0) == "embed" and _span(plan, 1, 3) == "block.0–block.2"  # one layer: its name alone
    assert "c0: embed–block.2, " in page
    assert "124 M parameters" in page and " B parameters" not in page
    assert [_parameters(n) for n in (1.2e6, 7.0e10, 1.03e12, 512)] == ["1.2 M", "70 B", "1.03 T", "512"]
    assert _count(3.2e12, "FLOP") == "3.2 TFLOP" and _count(0, "FLOP") == "0 FLOP"
    assert "forward + backward of one micro-batch (predicted)" in page and "time/µbatch" not in page
    # the stage table and the strategy column name layers the same way: block.0 is block.0 in both
    table = report_html(plan, recost(plan))
    row = re.search(r"<tr><td>0</td>.*?</tr>", table, re.S).group(0)
    assert "<pre class=nw>embed–block.5</pre>" in row and "tp2: embed\ntp2·rc: block.0–block.5" in row
    assert "dp2 (all 7 layers)" in page  # one strategy for the whole stage: said once
    names = [layer.name for layer in plan.layers if layer.stage == 0]
    assert names[0] == "embed" and names[-1] == "block.5"


def test_per_chunk_and_per_layer_figures_come_from_the_cost_tables(interleaved):
    from uniap.estimate import cost_plan
    from uniap.spec.families import build_layers

    fig = recost(interleaved)
    page = report_html(interleaved, fig)
    P = len(interleaved.stages)
    for j, t in enumerate(fig.chunk_p):  # every chunk's time, in its stage's row
        assert re.search(rf"c{j}: [^,]+, {t * 1e3:.2f} ms", page)
    assert np.allclose([sum(fig.chunk_p[i::P]) for i in range(P)], fig.p)
    model = build_layers(interleaved.model_config(), int(interleaved.model.seq_len))
    program, _, strategy_of = cost_plan(interleaved, model, load_cluster("a100-40g:1x4"))
    assert len(fig.layers) == len(interleaved.layers)
    for i in range(P):  # the layers' model states and activations add up to their stage's
        mine = [f for f, layer in zip(fig.layers, interleaved.layers) if layer.stage == i]
        assert sum(f.states for f in mine) == pytest.approx(fig.states[i])
        assert sum(f.activations for f in mine) == pytest.approx(fig.activations[i])
    u = 3
    assert fig.layers[u].time == program.A[u, strategy_of[u]] and fig.layers[u].params == model.layers[u].params
    layer_table = page[page.index("<h2>Layers</h2>"):]
    assert layer_table.count("<tr>") == len(interleaved.layers) + 1
    assert "forward FLOPs per micro-batch" in layer_table and "model states per device" in layer_table


def test_report_against_another_plan(plan, interleaved, tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    plan.save(a)
    interleaved.save(b)
    app = typer.Typer()
    app.command("report")(report_command)
    app.command("other")(lambda: None)
    runner = CliRunner()
    out = tmp_path / "ab.html"
    res = runner.invoke(app, ["report", str(a), "--against", str(b), "--out", str(out)])
    assert res.exit_code == 0, res.output
    page = out.read_text()
    side = page[page.index("Side by side"):page.index("Pipeline timeline")]
    ta, tb = plan.predicted["iteration_time_s"], interleaved.predicted["iteration_time_s"]
    assert "B / A" in side and f"{tb / ta:.3f}×" in side and "pp2·v2, c = 4" in side and "pp2, c = 4" in side
    res = runner.invoke(app, ["report", str(a), "--against", str(tmp_path / "missing.json"), "--out", str(out)])
    assert isinstance(res.exception, UniapError) and "cannot read plan" in str(res.exception)
