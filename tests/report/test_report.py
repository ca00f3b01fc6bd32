"""Plan reports: the timeline simulation, and the rendered HTML/PNG."""

import base64
from xml.etree import ElementTree
import json
import re

import numpy as np
import pytest
import typer
from matplotlib.image import imread
from typer.testing import CliRunner

from uniap.commands.report import report_command
from uniap.errors import UniapError
from uniap.estimate import estimate_uniform
from uniap.report import figures, recost, render_report, simulate
from uniap.schedules import schedule_named
from uniap.report.render import timeline_boxes
from uniap.spec import load_model
from uniap.spec.cluster import load_cluster
from uniap.spec.workload import Workload


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("P,c", [(1, 1), (1, 3), (3, 2), (4, 8), (4, 3)])
def test_timeline_has_every_box_in_order(schedule, P, c):
    rng = np.random.default_rng(P * 10 + c)
    p, o, g = rng.uniform(1, 3, P), rng.uniform(0, 0.5, P - 1), rng.uniform(0, 1, P)
    boxes = simulate(schedule, p, o, g, c)
    count = lambda kind: sum(b.kind == kind for b in boxes)  # noqa: E731
    assert count("forward") == count("backward") == P * c
    assert count("send") == count("send-grad") == (P - 1) * c
    assert count("sync") == P
    assert {b.stage for b in boxes} == set(range(P))
    for i in range(P):  # a stage does one thing at a time, in the schedule's order
        work = sorted((b for b in boxes if b.stage == i and b.kind in ("forward", "backward")), key=lambda b: b.start)
        assert all(a.end <= b.start + 1e-12 for a, b in zip(work, work[1:]))
        assert [(b.kind[0].upper(), i, b.micro) for b in work] == schedule_named(schedule).order(i, P, c)
        assert all(b.duration == pytest.approx(p[i] / 3 if b.kind == "forward" else 2 * p[i] / 3) for b in work)
    done = {(b.kind, b.stage, b.micro): b for b in boxes}
    for i in range(1, P):  # a forward waits for the previous stage's forward and the send
        for m in range(c):
            assert done["forward", i, m].start >= done["forward", i - 1, m].end + o[i - 1] / 2 - 1e-12
            assert done["backward", i - 1, m].start >= done["backward", i, m].end + o[i - 1] / 2 - 1e-12


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_uniform_stages_take_the_cost_models_time(schedule):
    # equal stages, no sends: both schedules take (c + P − 1)·p, the cost model's Σp + (c − 1)·max p
    P, c, p = 4, 6, 2.0
    boxes = simulate(schedule, [p] * P, [0.0] * (P - 1), [0.0] * P, c)
    assert max(b.end for b in boxes) == pytest.approx((c + P - 1) * p)
    if schedule == "1f1b":
        order = schedule_named("1f1b").order
        assert order(0, P, c)[:4] == [("F", 0, 0), ("F", 0, 1), ("F", 0, 2), ("F", 0, 3)]
        assert order(P - 1, P, c)[:2] == [("F", P - 1, 0), ("B", P - 1, 0)]
    with pytest.raises(UniapError):
        simulate(schedule, [1.0, 1.0], [], [0.0, 0.0], 2)


@pytest.fixture(scope="module")
def plan():
    spec = load_model("gpt2")
    return estimate_uniform(spec, load_cluster("a100-40g:1x4"), Workload(16, spec.seq_len, "bf16"), tp=2, pp=2,
                            micro_batches=4, recompute=True)


def _drawn(ax, colour) -> int:
    """Rectangles drawn in `colour` on a timeline axes (each colour is one compound path of rectangles)."""
    from matplotlib.colors import to_rgb

    return sum(len(p.get_path().to_polygons()) for p in ax.patches
               if np.allclose(p.get_facecolor()[:3], to_rgb(colour)) and not p.get_hatch())


def test_timeline_panel_draws_P_rows_and_every_box(plan):
    fig = recost(plan)
    assert fig.tpi == pytest.approx(plan.predicted["iteration_time_s"], rel=1e-12)
    assert fig.p == pytest.approx(plan.predicted["stage_time_s"])
    boxes = timeline_boxes(plan, fig)
    f = figures.new_figure(8, 3)
    ax, = figures.draw_timeline(f, f.add_gridspec(1, 1)[0, 0], boxes, 2, "1f1b", 4, fig.tpi)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["stage 0", "stage 1"]
    for kind in ("forward", "backward"):
        assert _drawn(ax, figures.COLORS[kind]) == 2 * 4


def _images(text):
    """The report's embedded figures, parsed as SVG documents."""
    found = re.findall(r'src="data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)"', text)
    return [ElementTree.fromstring(base64.b64decode(x)) for x in found]


def test_render_report_html_and_png(plan, tmp_path):
    out, png = tmp_path / "r.html", tmp_path / "r.png"
    assert render_report(plan, out, png=png) == out
    text = out.read_text()
    assert text.startswith("<!DOCTYPE html>") and "<script" not in text and "http" not in text
    images = _images(text)
    assert len(images) == 4 and all(im.tag.endswith("svg") and len(list(im.iter())) > 50 for im in images)
    assert "gpt2" in text and "Pipeline timeline" in text and "measured" not in text
    assert "Strategy labels" in text and "plan digest" in text and "idle share" in text
    assert imread(png).shape[0] > 600  # 200 dpi


def test_render_report_with_a_run(plan, tmp_path):
    run = {"iteration_time_s": 0.5, "stage_time_s": [0.1, 0.12],
           "peak_memory_bytes": [3e9, 3.1e9, 4e9, 4.2e9]}  # per rank: the worst rank of each stage is shown
    out = render_report(plan, tmp_path / "r.html", run=run)
    text = out.read_text()
    assert "measured, per micro-batch" in text and "measured peak memory" in text and "4.20 GB" in text
    assert "measured / predicted" in text
    # a run's stage time adds up the step's micro-batches: shown per micro-batch next to the prediction
    c = plan.pipeline.micro_batches
    assert f"{0.12 / c * 1e3:.2f} ms" in text
    assert len(_images(text)) == 4
    for bad, msg in (({"stage_time_s": [1.0]}, "expected 2"), ({"iteration_time_s": -1}, "positive"),
                     ({"peak_memory_bytes": "x"}, "list of numbers"), ([1, 2], "JSON object")):
        with pytest.raises(UniapError, match=msg):
            render_report(plan, tmp_path / "bad.html", run=bad)


def test_report_without_a_loadable_cluster_uses_the_plan(plan, tmp_path):
    from dataclasses import replace

    other = replace(plan, cluster=replace(plan.cluster, name="my-yaml-cluster"))
    fig = recost(other)
    assert "not re-costed" in fig.note and fig.p == pytest.approx(plan.predicted["stage_time_s"])
    assert render_report(other, tmp_path / "r.html").exists()


def test_report_command(plan, tmp_path):
    plan_path, run_path = tmp_path / "plan.json", tmp_path / "run.json"
    plan.save(plan_path)
    run_path.write_text(json.dumps({"iteration_time_s": 0.4, "stage_time_s": [0.1, 0.1]}))
    app = typer.Typer()
    app.command("report")(report_command)
    app.command("other")(lambda: None)
    runner = CliRunner()
    out, png = tmp_path / "o.html", tmp_path / "o.png"
    res = runner.invoke(app, ["report", str(plan_path), "--run", str(run_path), "--out", str(out), "--png", str(png)])
    assert res.exit_code == 0, res.output
    assert out.exists() and imread(png).size
    res = runner.invoke(app, ["report", str(tmp_path / "missing.json")])
    assert isinstance(res.exception, UniapError) and "cannot read plan" in str(res.exception)
    (tmp_path / "bad.json").write_text("{")
    res = runner.invoke(app, ["report", str(plan_path), "--run", str(tmp_path / "bad.json")])
    assert isinstance(res.exception, UniapError) and "not valid JSON" in str(res.exception)


def test_plan_digest_tells_two_plans_of_one_model_apart(plan):
    from dataclasses import replace

    from uniap.report.render import plan_digest

    other = replace(plan, pipeline=replace(plan.pipeline, micro_batches=plan.pipeline.micro_batches * 2))
    assert other.fingerprint == plan.fingerprint and plan_digest(other) != plan_digest(plan)


def test_small_memory_is_shown_in_megabytes(plan, tmp_path):
    run = {"iteration_time_s": 0.5, "stage_time_s": [0.1, 0.12], "peak_memory_bytes": [3e8, 4.2e8]}
    text = render_report(plan, tmp_path / "r.html", run=run).read_text()
    assert "420.0 MB" in text and "0.00 GB" not in text
