"""`compare` and `uniap compare`: UniAP beside the baselines on the same costs; UniAP is never slower."""

import importlib.util
import json
import sys
import types

import pytest
import typer
from typer.testing import CliRunner

from uniap.baselines import compare, parse_methods
from uniap.commands.compare import compare_command
from uniap.errors import UniapError
from uniap.spec import load_model
from uniap.spec.cluster import load_cluster
from uniap.spec.workload import Workload

ROW_KEYS = {"method", "iteration_time_s", "throughput_samples_per_s", "speedup_of_uniap", "search_time_s", "fits"}


def _stub_plan_search(model, cluster, workload, *, schedule="1f1b", solver="highs", time_limit=None, max_tp=None,
                      workers=None, progress=None):
    """Test-only stand-in for `uniap.planner.plan_search` while it has not landed: UniAP's UOP — every pipeline
    configuration solved exactly by the MIQP (`solve.milp.solve`), the best kept."""
    import time

    from uniap.baselines.common import programs, stage_strategies
    from uniap.estimate import make_plan, predict
    from uniap.solve.milp import solve

    start = time.perf_counter()
    best, n = None, 0
    for bound, strategies, program in programs(model, cluster, workload, schedule,
                                               lambda p: stage_strategies(cluster, p, max_tp)):
        n += 1
        if best is not None and bound >= best[0].objective:
            continue
        sol = solve(program, solver=solver, time_limit=time_limit,
                    cutoff=None if best is None else best[0].objective)
        if sol is not None and (best is None or sol.objective < best[0].objective):
            best = (sol, program, strategies)
    if best is None:
        raise UniapError("no plan fits")
    sol, program, strategies = best
    predicted = predict(model, cluster, workload, program, sol.stage_of, sol.strategy_of)
    search = {"solver": solver, "time_s": time.perf_counter() - start, "optimal": sol.optimal, "gap": sol.gap,
              "candidates": n}
    return make_plan(model, cluster, workload, schedule, program.micro_batches, strategies, sol.stage_of,
                     sol.strategy_of, predicted, search)


def _real_planner_imports() -> bool:
    try:
        import uniap.planner  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.fixture(autouse=True)
def planner(monkeypatch):
    """The real planner when it imports; the stub above otherwise (needs the MIQP solver, `solve.milp`)."""
    if not _real_planner_imports():
        if importlib.util.find_spec("uniap.solve.milp") is None:
            pytest.skip("neither uniap.planner nor the MIQP solver is there yet")
        monkeypatch.setitem(sys.modules, "uniap.planner", types.SimpleNamespace(plan_search=_stub_plan_search))


CASES = [
    ("gpt2", "a100-40g:1x4", 16, "bf16"),
    ("bert-large", "titanxp-12g:1x4", 16, "fp32"),
    ("bert-huge", "titanxp-12g:2x2", 8, "fp32"),
    ("tiny-llama", "cpu:2x2", 8, "fp32"),
    ("vit-huge", "a100-40g:1x4", 32, "bf16"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] + "@" + c[1] for c in CASES])
def test_uniap_is_never_slower_than_any_baseline(case):
    name, cluster, batch, precision = case
    spec = load_model(name)
    result = compare(spec, load_cluster(cluster), Workload(batch, spec.seq_len, precision))
    rows = {r["method"]: r for r in result["rows"]}
    assert list(rows) == ["uniap", "megatron-grid", "galvatron", "alpa", "dp", "zero3"]
    ours = rows["uniap"]
    assert ours["fits"] and ours["speedup_of_uniap"] == pytest.approx(1.0)
    for method, row in rows.items():
        assert ROW_KEYS <= set(row) and row["search_time_s"] >= 0
        if row["fits"]:
            assert row["iteration_time_s"] >= ours["iteration_time_s"] * (1 - 1e-9), method
            assert row["speedup_of_uniap"] >= 1 - 1e-9
            assert row["throughput_samples_per_s"] == pytest.approx(batch / row["iteration_time_s"])
        else:
            assert row["iteration_time_s"] is None and row["speedup_of_uniap"] is None
    json.dumps(result)  # the whole result is JSON


def test_compare_subset_and_names():
    spec = load_model("tiny-llama")
    clus, wl = load_cluster("cpu:1x2"), Workload(4, spec.seq_len, "fp32")
    result = compare(spec, clus, wl, methods="dp, zero3")
    assert [r["method"] for r in result["rows"]] == ["dp", "zero3"]
    assert all(r["speedup_of_uniap"] is None for r in result["rows"])  # no uniap row to compare with
    assert parse_methods(["uniap,megatron", "fsdp", "uniap"]) == ["uniap", "megatron-grid", "zero3"]
    with pytest.raises(UniapError, match="unknown method"):
        parse_methods("uniap,deepspeed")
    with pytest.raises(UniapError, match="no method"):
        parse_methods(" , ")
    with pytest.raises(UniapError, match="unknown solver"):
        compare(spec, clus, wl, methods="uniap", solver="cplex")


def test_nothing_fits_anywhere():
    spec = load_model("llama2-70b", 512)
    result = compare(spec, load_cluster("titanxp-12g:1x2"), Workload(2, 512, "fp32"))
    assert not any(r["fits"] for r in result["rows"])
    assert all(r["throughput_samples_per_s"] is None for r in result["rows"])


def _app():
    app = typer.Typer()
    app.command("compare")(compare_command)
    app.command("other")(lambda: None)  # keep `compare` a sub-command, as in the real CLI
    return app


def test_compare_command_json_and_table():
    runner = CliRunner()
    args = ["compare", "--model", "gpt2", "--cluster", "a100-40g:1x4", "--global-batch", "16",
            "--methods", "uniap,megatron-grid", "--methods", "dp"]
    res = runner.invoke(_app(), args + ["--format", "json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert [r["method"] for r in data["rows"]] == ["uniap", "megatron-grid", "dp"]
    assert data["workload"] == {"global_batch": 16, "seq_len": 1024, "precision": "bf16", "expert_imbalance": 1.1}
    res = runner.invoke(_app(), args + ["--precision", "fp32", "--schedule", "gpipe"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    for word in ("uniap", "megatron-grid", "dp", "speed-up", "search time"):
        assert word in res.output
    bad = runner.invoke(_app(), ["compare", "--model", "gpt2", "--cluster", "a100-40g:1x4", "--global-batch", "16",
                                 "--methods", "nope"])
    assert isinstance(bad.exception, UniapError) and "unknown method" in str(bad.exception)
