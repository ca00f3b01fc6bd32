"""Issue 24: the spread of every profiled figure is recorded, and calibrated predictions carry an interval derived
from it (estimate, plan with its runner-ups, run's measured time against it); `uniap profile --passes N` measures
in N launches."""

import json
import math
from dataclasses import replace

import pytest
from synthetic import SIZES, TINY, synthetic_raw

from uniap.errors import UniapError
from uniap.plans import IntervalSection, Plan
from uniap.profile import collect
from uniap.profile.calibration import calibrate
from uniap.profile.collect import assemble, merge_raw
from uniap.intervals import Intervals, interval_line, measured_against
from uniap.profile.uncertainty import (MODEL_ERROR_FILE, Z95, first_passes, fit_classes, fit_model_error, half_widths,
                                       model_error_of, prediction_interval, relays_out, replicate_profiles, t95)
from uniap.spec.cluster import load_cluster
from uniap.spec.families import build_layers
from uniap.spec.workload import Workload

SEQ, WORLD = 32, 4
RATES = (18e9, 20e9, 23e9)  # three passes on a machine whose speed drifts


def spec(passes: int) -> dict:
    return {"micro_batch_sizes": SIZES, "warmup": 1, "reps": 3, "passes": passes, "rep_seconds": 0.05}


def three_pass_profile() -> dict:
    raws = [synthetic_raw(TINY, SEQ, WORLD, rate=r, reps=3) for r in RATES]
    merged = merge_raw(merge_raw(raws[0], raws[1]), raws[2])
    doc = assemble(merged, TINY, SEQ, WORLD, spec(3))
    doc["device"]["cores"] = WORLD
    return doc


def test_every_figure_records_its_repetitions_and_the_spread_of_its_passes():
    doc = three_pass_profile()
    rec = next(r for r in doc["layers"] if r["kind"] == "block" and r["stage_size"] == 1 and not r["runs_as"])
    assert [len(v) for v in rec["reps_s"]] == [9] * len(SIZES)  # 3 passes of 3 repetitions
    assert all(len(m) == 3 for m in rec["pass_median_s"])
    slow, fast = rec["pass_median_s"][-1][0], rec["pass_median_s"][-1][2]
    assert slow > fast and rec["pass_spread"][-1] == pytest.approx((slow - fast) / rec["fwd_bwd_s"][-1])
    assert rec["spread"][-1] == pytest.approx(rec["pass_spread"][-1])  # repetitions within a pass agree
    coll = doc["collectives"][0]
    assert all(len(m) == 3 for m in coll["pass_median_s"]) and coll["pass_spread"] == [0.0] * len(coll["bytes"])


def test_an_old_profile_without_repetitions_still_calibrates_and_has_no_interval():
    doc = three_pass_profile()
    for rec in doc["layers"] + doc["collectives"]:
        for key in ("reps_s", "pass_median_s", "pass_spread"):
            rec.pop(key)
    cluster = calibrate(load_cluster("cpu:1x4"), doc)
    assert replicate_profiles(doc) == ([], "none")
    assert not Intervals(cluster, doc, build_layers(TINY, SEQ), Workload(8, SEQ, "fp32")).available
    with pytest.raises(UniapError, match="records no repetitions"):
        first_passes(doc, 1)


def test_the_interval_is_the_student_t_prediction_interval_of_the_replicates():
    low, high = prediction_interval(2.0, [1.0, 2.0, 3.0])  # s = 1, n = 3
    half = 2.920 * 1.0 * math.sqrt(1 + 1 / 3)
    assert (low, high) == pytest.approx((max(2.0 - half, 0.0), 2.0 + half))
    low, high = prediction_interval(10.0, [9.9, 10.0, 10.1, 10.0])
    assert high - 10.0 == pytest.approx(10.0 - low) and t95(3) == 2.353 and t95(100) == 1.645
    with pytest.raises(UniapError, match="at least 2"):
        prediction_interval(1.0, [1.0])


def test_the_model_error_joins_the_profile_noise_in_quadrature():
    h_p, h_m = half_widths(2.0, [1.0, 2.0, 3.0], 0.1)
    assert h_p == pytest.approx(2.920 * math.sqrt(4 / 3)) and h_m == pytest.approx(Z95 * 0.1 * 2.0)
    low, high = prediction_interval(2.0, [1.0, 2.0, 3.0], 0.1)
    assert high - 2.0 == pytest.approx(math.hypot(h_p, h_m))
    # no profile spread: the model error alone; no model error: the profile's interval as before
    assert prediction_interval(4.0, [4.0, 4.0, 4.0], 0.1) == pytest.approx((4.0 - Z95 * 0.4, 4.0 + Z95 * 0.4))
    assert prediction_interval(2.0, [1.0, 2.0, 3.0], 0.0) == prediction_interval(2.0, [1.0, 2.0, 3.0])


def test_the_model_error_is_what_the_profiles_spread_leaves_unexplained():
    def row(predicted, measured, spread):
        return {"predicted_s": predicted, "measured_s": measured, "replicate_s": [predicted - spread, predicted,
                                                                                   predicted + spread]}

    # exact replicates: σ_m is the root mean square relative error
    rows = [row(1.0, 1.1, 0.0), row(2.0, 1.6, 0.0), row(1.0, 1.0, 0.0)]
    assert fit_model_error(rows) == pytest.approx(math.sqrt((0.1 ** 2 + 0.2 ** 2) / 3))
    # a spread that explains more than the errors: nothing left for the model
    assert fit_model_error([row(1.0, 1.05, 0.2)]) == 0.0
    # the spread's share is taken out: s² (1 + 1/n) with s the replicates' standard deviation over the prediction
    assert fit_model_error([row(1.0, 1.3, 0.1)]) == pytest.approx(math.sqrt(0.09 - 0.01 * 4 / 3))
    with pytest.raises(UniapError, match="at least one plan"):
        fit_model_error([])
    # per class: only the classes the rows hold
    classed = [{**row(1.0, 1.1, 0.0), "relayout": False}, {**row(2.0, 1.6, 0.0), "relayout": True}]
    assert fit_classes(classed) == pytest.approx({"one layout": 0.1, "relayout": 0.2})
    assert fit_classes(classed[:1]) == pytest.approx({"one layout": 0.1})


def test_the_model_error_is_fitted_on_the_runs_the_package_ships_per_class_and_only_for_their_kind_of_device():
    doc = json.loads(MODEL_ERROR_FILE.read_text())
    rows = doc["kinds"]["cpu"]["rows"]
    assert {r["model"] for r in rows} == {"demo-gpt", "gqa-llama"}
    for relayout in (False, True):
        error = model_error_of("cpu", relayout)
        mine = [r for r in rows if r["relayout"] == relayout]
        assert error.relayout == relayout and error.plans == len(mine) >= 10
        assert error.sigma == pytest.approx(fit_model_error(mine)) and "December 2026" in error.source
    assert model_error_of("cuda", False) is None and model_error_of(None, True) is None


def test_a_plan_relays_out_when_its_layers_split_differently_recompute_aside():
    from uniap.estimate import estimate_uniform

    model, workload = build_layers(TINY, SEQ), Workload(8, SEQ, "fp32")
    plan = estimate_uniform(model, load_cluster("cpu:1x4"), workload, dp=4)
    assert not relays_out(plan)
    layers = list(plan.layers)
    layers[1] = replace(layers[1], strategy=replace(layers[1].strategy, recompute="full"))
    assert not relays_out(replace(plan, layers=tuple(layers)))
    layers[1] = replace(layers[1], strategy=replace(layers[1].strategy, zero=3))
    assert relays_out(replace(plan, layers=tuple(layers)))


def test_an_interval_holds_the_model_error_of_its_kind_of_device_and_says_so():
    from uniap.estimate import estimate_uniform

    doc = three_pass_profile()
    model, workload = build_layers(TINY, SEQ), Workload(8, SEQ, "fp32")
    cluster = calibrate(load_cluster("cpu:1x4"), doc, model=model, workload=workload)
    plan = estimate_uniform(model, cluster, workload, tp=2, dp=2)
    point = plan.predicted["iteration_time_s"]
    iv = Intervals(cluster, doc, model, workload).of(plan)
    assert doc["device"]["kind"] == "cpu" and iv.model_error == model_error_of("cpu", relays_out(plan)).sigma
    assert iv.high_s - point == pytest.approx(math.hypot(*half_widths(point, list(iv.replicate_s), iv.model_error)))
    assert "model error" in iv.method and "fitted on" in iv.method
    line = interval_line(replace(plan, interval=iv))
    assert "profile noise ±" in line and "model error ±" in line
    gpu = {**doc, "device": {**doc["device"], "kind": "cuda"}}  # no runs measured the model's error there
    iv = Intervals(load_cluster("a100-80g:1x4"), gpu, model, workload).of(plan)
    assert iv.model_error is None and (iv.low_s, iv.high_s) == pytest.approx(prediction_interval(point, list(iv.replicate_s)))
    assert "not in it" in iv.method and "profile noise alone" in interval_line(replace(plan, interval=iv))


def test_replicates_are_the_passes_and_first_passes_rebuild_the_profile_so_far():
    doc = three_pass_profile()
    reps, kind = replicate_profiles(doc)
    assert kind == "passes" and len(reps) == 3
    rec = next(i for i, r in enumerate(doc["layers"]) if r["kind"] == "block")
    assert reps[0]["layers"][rec]["fwd_bwd_s"] == doc["layers"][rec]["pass_median_s"][0] or \
        [v[0] for v in doc["layers"][rec]["pass_median_s"]] == reps[0]["layers"][rec]["fwd_bwd_s"]
    one = first_passes(doc, 1)
    assert one["layers"][rec]["fwd_bwd_s"] == [v[0] for v in doc["layers"][rec]["pass_median_s"]]
    assert first_passes(doc, 3)["layers"][rec]["fwd_bwd_s"] == pytest.approx(doc["layers"][rec]["fwd_bwd_s"])
    single = assemble(synthetic_raw(TINY, SEQ, WORLD, reps=3), TINY, SEQ, WORLD, spec(1))
    reps, kind = replicate_profiles(single)
    assert kind == "repetitions" and len(reps) == 3


def test_a_calibrated_prediction_gets_an_interval_that_holds_the_passes_predictions():
    from uniap.estimate import estimate_uniform

    doc = three_pass_profile()
    model, workload = build_layers(TINY, SEQ), Workload(8, SEQ, "fp32")
    cluster = calibrate(load_cluster("cpu:1x4"), doc, model=model, workload=workload)
    plan = estimate_uniform(model, cluster, workload, tp=2, dp=2)
    iv = Intervals(cluster, doc, model, workload, "p.json").of(plan)
    point = plan.predicted["iteration_time_s"]
    assert iv.kind == "passes" and iv.replicates == 3 and iv.level == 0.9 and iv.profile == "p.json"
    assert iv.low_s < min(iv.replicate_s) <= max(iv.replicate_s) < iv.high_s
    assert iv.low_s < point < iv.high_s and "t(0.95, 2)" in iv.method
    assert max(iv.replicate_s) > min(iv.replicate_s) * 1.02  # the 18 and 23 GFLOP/s passes differ


def test_the_plan_json_records_the_interval_and_old_plans_still_load():
    from uniap.estimate import estimate_uniform

    model, workload = build_layers(TINY, SEQ), Workload(8, SEQ, "fp32")
    plan = estimate_uniform(model, load_cluster("cpu:1x4"), workload, dp=4)
    assert plan.interval is None and "interval" not in plan.to_json()
    section = IntervalSection(low_s=0.9, high_s=1.2, level=0.9, replicates=3, kind="passes",
                              replicate_s=[1.0, 1.05, 0.95], method="m", profile="p.json")
    again = Plan.from_json(json.loads(replace(plan, interval=section).dumps()))
    assert again.interval == section and again.interval.replicate_s == (1.0, 1.05, 0.95)
    assert again.interval.model_error is None  # a plan written before intervals held the model error
    held = replace(section, model_error=0.11)
    assert Plan.from_json(json.loads(replace(plan, interval=held).dumps())).interval.model_error == 0.11
    data = json.loads(replace(plan, interval=section).dumps())
    data["interval"]["width"] = 1
    with pytest.raises(UniapError, match=r"unknown interval field\(s\) \['width'\]"):
        Plan.from_json(data)
    data["interval"].pop("width")
    data["interval"]["low_s"] = 2.0
    with pytest.raises(UniapError, match="not 0 <= low <= high"):
        Plan.from_json(data)


def test_run_prints_the_measured_time_against_the_interval(tmp_path):
    from uniap.cli import _against_interval
    from uniap.estimate import estimate_uniform

    model, workload = build_layers(TINY, SEQ), Workload(8, SEQ, "fp32")
    plan = estimate_uniform(model, load_cluster("cpu:1x4"), workload, dp=4)
    point = plan.predicted["iteration_time_s"]
    plan = replace(plan, interval=IntervalSection(low_s=point * 0.9, high_s=point * 1.1, level=0.9, replicates=3,
                                                  kind="passes", replicate_s=[point] * 3, method="m"))
    path = tmp_path / "plan.json"
    plan.save(path)
    assert "inside" in _against_interval(str(path), {"iteration_time_s": point * 1.05})
    assert "ABOVE" in measured_against(plan, point * 1.2) and "BELOW" in measured_against(plan, point * 0.5)
    assert measured_against(replace(plan, interval=None), point) is None


def test_profile_passes_measure_in_that_many_launches(monkeypatch):
    launches = []

    def spawn(request, nproc, timeout_s, progress):
        launches.append(request["passes"])
        return synthetic_raw(TINY, SEQ, WORLD, rate=RATES[len(launches) - 1], reps=request["reps"])

    monkeypatch.setattr(collect, "_spawn", spawn)
    monkeypatch.setattr(collect, "check_request", lambda *a: None)
    doc = collect.measure_in_launches(TINY, SEQ, WORLD, 3, micro_batch_sizes=SIZES, reps=2)
    assert launches == [1, 1, 1] and doc["method"]["passes"] == 3
    assert all(len(m) == 3 for r in doc["layers"] for m in r["pass_median_s"])
    with pytest.raises(UniapError, match="--passes must be >= 1"):
        collect.measure_in_launches(TINY, SEQ, WORLD, 0)


def test_plan_with_a_profile_prints_its_interval_and_runner_ups_ties_marked(tmp_path, cli, cli_json):
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(three_pass_profile()))
    args = ["plan", "--model", "tiny-gpt", "--cluster", "cpu:1x4", "--global-batch", "8", "--seq-len", str(SEQ),
            "--precision", "fp32", "--schedule", "1f1b", "--profile", str(path)]
    plan = cli_json(*args)
    iv = plan["interval"]
    assert iv["low_s"] < plan["predicted"]["iteration_time_s"] < iv["high_s"] and iv["kind"] == "passes"
    ups = plan["search"]["runner_ups"]
    assert ups and all(u["slower"] >= 0 for u in ups)
    assert all(u["tie"] == (u["iteration_time_s"] <= iv["high_s"]) for u in ups)
    text = " ".join(cli(*args).stdout.split())  # rich wraps at the terminal's width
    assert "90% interval" in text and "prediction interval" in text and "runner-ups" in text
    estimate = " ".join(cli("estimate", "--model", "tiny-gpt", "--cluster", "cpu:1x4", "--global-batch", "8", "--seq-len",
                   str(SEQ), "--precision", "fp32", "--dp", "4", "--profile", str(path)).stdout.split())
    assert "90% interval" in estimate


def test_a_runner_up_priced_faster_than_the_searchs_plan_becomes_the_chosen_one():
    """Priced by its own stages (`estimate.as_planned`), a runner-up can beat the plan the search ranked first by
    balanced ones: it is then chosen, and the search's plan is listed as a runner-up."""
    from uniap.estimate import estimate_uniform
    from uniap.runnerups import runner_ups

    model = build_layers(TINY, SEQ)
    workload = Workload(8, SEQ, "fp32")
    cluster = calibrate(load_cluster("cpu:1x4"), three_pass_profile(), model=model, workload=workload)
    slow = estimate_uniform(model, cluster, workload, tp=2, dp=1, pp=2, micro_batches=2)  # not the best
    slow = replace(slow, search={"solver": "highs", "optimal": True})
    chosen, found, complete = runner_ups(model, cluster, workload, slow, None, schedule="1f1b")
    assert complete and found
    assert chosen.predicted["iteration_time_s"] < slow.predicted["iteration_time_s"]
    assert chosen.search["solver"] == "highs" and chosen.search["search_ranked_first"]
    assert all(r.slower >= 0 for r in found)
    assert any(r.plan.predicted == slow.predicted for r in found)
