"""`uniap plan`: never worse than any hand configuration, re-costable, clear when nothing fits."""

import itertools
import json
import re

import pytest

from uniap.errors import UniapError
from uniap.estimate import estimate_uniform
from uniap.planner import min_peak_memory, plan_search
from uniap.spec import load_model
from uniap.spec.cluster import load_cluster
from uniap.spec.workload import Workload
from uniap.strategies import divisors

CASES = [
    ("gpt2-medium", "a100-40g:1x8", 32, None),
    ("bert-large", "titanxp-12g:1x4", 16, None),
    ("llama2-7b", "a100-80g:2x4", 16, 2048),
    ("t5-large", "v100-32g:1x4", 16, 256),
]


def best_uniform(model, cluster, workload):
    """Every uniform configuration `estimate` accepts: tp × pp × ZeRO × micro-batch size × recompute × sp."""
    n = cluster.devices
    best = None
    for tp, pp in itertools.product(divisors(n), divisors(n)):
        if n % (tp * pp):
            continue
        dp = n // (tp * pp)
        for zero, mbs, rc, sp in itertools.product(range(4) if dp > 1 else (0,), divisors(workload.global_batch),
                                                   (False, True), (False, True) if tp > 1 else (False,)):
            try:
                plan = estimate_uniform(model, cluster, workload, tp=tp, pp=pp, zero=zero, micro_batch_size=mbs,
                                        recompute=rc, sequence_parallel=sp)
            except UniapError:
                continue
            if plan.predicted["fits"] and (best is None or plan.predicted["iteration_time_s"] < best):
                best = plan.predicted["iteration_time_s"]
    return best


@pytest.mark.parametrize("name, cluster, batch, seq", CASES)
def test_plan_is_never_worse_than_the_best_uniform_configuration(name, cluster, batch, seq):
    model = load_model(name, seq)
    clus = load_cluster(cluster)
    workload = Workload(batch, model.seq_len, "fp16" if cluster.startswith(("v100", "titanxp")) else "bf16")
    if cluster.startswith("titanxp"):
        workload = Workload(batch, model.seq_len, "fp32")
    plan = plan_search(model, clus, workload, workers=1)
    uniform = best_uniform(model, clus, workload)
    assert uniform is not None
    assert plan.search["optimal"]
    assert plan.predicted["fits"]
    assert plan.predicted["iteration_time_s"] <= uniform * (1 + 1e-6)


def test_plan_cli_json_and_recost(cli_json, tmp_path):
    out = tmp_path / "plan.json"
    plan = cli_json("plan", "--model", "gpt2", "--cluster", "a100-40g:1x4", "--global-batch", "16", "--out", str(out))
    assert plan["schema"] == "uniap.plan/1"
    assert set(plan["search"]) >= {"solver", "time_s", "optimal", "gap", "candidates"}
    assert plan["search"]["solver"] == "highs" and plan["search"]["optimal"] is True
    assert json.loads(out.read_text())["predicted"] == plan["predicted"]
    again = cli_json("estimate", "--plan", str(out))
    assert again["predicted"]["iteration_time_s"] == pytest.approx(plan["predicted"]["iteration_time_s"], rel=1e-12)


def test_no_plan_fits_names_the_memory_needed(cli):
    proc = cli("plan", "--model", "llama2-70b", "--cluster", "titanxp-12g:1x2", "--global-batch", "2",
               "--precision", "fp32", check=False)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "leanest plan needs" in lines[0], proc.stderr


def test_no_plan_message_is_not_fooled_by_chunks(cli):
    """An interleaved program's chunks share device groups, so they are not partitioned as if each had its own:
    the figure named is at least the model states (16 B per parameter) spread over every device."""
    proc = cli("plan", "--model", "deepseek-v3", "--cluster", "h100-80g:8x8", "--global-batch", "512",
               "--seq-len", "4096", check=False)
    assert proc.returncode != 0
    need = float(re.search(r"leanest plan needs ([0-9.]+) GB", proc.stderr).group(1))
    assert need * 1e9 >= 671_026_404_352 * 16 / 64


def test_min_peak_memory_is_the_true_minimum():
    """Against brute force over every split and strategy on a small chain."""
    import numpy as np

    from uniap.cost.tables import build_program
    from uniap.strategies import enumerate_strategies

    model = load_model("tiny-gpt", 32)
    clus = load_cluster("cpu:1x4")
    program = build_program(model, clus, Workload(8, 32, "fp32"), 2, 4, enumerate_strategies(2), "gpipe")
    L = program.layers
    best = np.inf
    for cut in range(1, L):
        stages = [range(0, cut), range(cut, L)]
        worst = 0.0
        for i, members in enumerate(stages):
            worst = max(worst, sum(min(program.Ms[u, k] + program.inflight[i] * program.Ma[u, k]
                                       for k in range(program.strategies) if program.allowed[u, k])
                                   for u in members))
        best = min(best, worst)
    assert min_peak_memory(program) == pytest.approx(best)


def test_time_limit_bounds_the_whole_search_and_says_what_it_skipped():
    # with (next to) no time the search keeps the first uniform plan it can build and stops building tables
    model = load_model("gpt3-1.3b", 2048)
    plan = plan_search(model, load_cluster("a100-40g:4x8"), Workload(256, 2048, "bf16"), time_limit=1e-6, workers=1)
    search = plan.search
    assert not search["optimal"] and search["unbounded"] > 0 and search["gap"] == 1.0
    assert plan.predicted["fits"]
    full = plan_search(model, load_cluster("a100-40g:4x8"), Workload(256, 2048, "bf16"), workers=1)
    assert full.search["optimal"] and full.search["unbounded"] == 0
    assert full.predicted["iteration_time_s"] <= plan.predicted["iteration_time_s"] * (1 + 1e-9)


def test_the_build_cache_reaches_the_workers_empty():
    """The search's workers fill their own caches: the tables this process priced stay here, so starting the
    pool does not pickle megabytes per worker."""
    import pickle

    from uniap.planner import BuildCache, Candidate, candidate_builder

    model = load_model("gpt2-medium")
    build = candidate_builder(model, load_cluster("a100-40g:1x8"), Workload(32, model.seq_len, "bf16"), None)
    program = build(Candidate(2, 4, 1, "1f1b"))
    assert program is not None and build.keywords["cache"]
    sent = pickle.loads(pickle.dumps(build))
    assert isinstance(sent.keywords["cache"], BuildCache) and not sent.keywords["cache"]
    again = sent(Candidate(2, 4, 1, "1f1b"))
    assert (again.A == program.A).all() and sent.keywords["cache"]
