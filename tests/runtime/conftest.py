"""Grouped torchrun launches shared by the runtime tests.

Each torchrun launch costs ~8 s of start-up on this machine, so the equality checks run as a few
grouped launches (session fixtures), and each test then asserts on its plan's result.
"""

from __future__ import annotations

import pytest

from runtime_cases import GQA, LLAMA, LR, context_plans, equality_plans, family_plans, memory_plans, planned_gpt2


@pytest.fixture(scope="session")
def equality_results(tmp_path_factory):
    """One 4-rank launch: every equality plan (check=True), plus the checkpoint-writing run and an
    uninterrupted run of the same plan for the resume test, and checkpoints crossing between a plain and an
    interleaved plan in both directions, `uniap plan`'s plan for GPT-2's (shrunk) config.json, and the memory
    plans."""
    from uniap.runtime.job import TrainingJob as Job
    from uniap.runtime.launch import run_many
    from uniap.runtime.plans import uniform_plan

    root = tmp_path_factory.mktemp("equality")
    names, jobs = [], []
    for name, (plan, extra) in equality_plans().items():
        path = root / f"{name}.json"
        plan.save(path)
        names.append(name)
        jobs.append(Job(str(path), steps=3, check=True, lr=LR, **extra))
    save_plan = root / "llama-pp2-tp2-save.json"
    uniform_plan(LLAMA, 4, pp=2, tp=2, micro_batches=2).save(save_plan)
    ckdir = root / "ckpt"
    names += ["save", "uninterrupted"]
    jobs += [Job(str(save_plan), steps=3, lr=LR, checkpoint_dir=str(ckdir), checkpoint_every=3),
             Job(str(save_plan), steps=5, lr=LR)]
    interleaved_plan = root / "llama-pp2-v2-tp2.json"  # written by the equality loop above
    v2_dir = root / "ckpt-v2"
    names += ["save-v2", "resume-plain-from-v2", "resume-v2-from-plain"]
    jobs += [Job(str(interleaved_plan), steps=3, lr=LR, checkpoint_dir=str(v2_dir), checkpoint_every=3),
             Job(str(save_plan), steps=5, lr=LR, check=True, resume=True, checkpoint_dir=str(v2_dir)),
             Job(str(interleaved_plan), steps=5, lr=LR, check=True, resume=True, checkpoint_dir=str(ckdir))]
    names.append("gpt2-hf-planned")
    jobs.append(Job(str(planned_gpt2(root)), steps=3, check=True, lr=LR))
    for name, plan in memory_plans().items():
        plan.save(root / f"{name}.json")
        names.append(name)
        jobs.append(Job(str(root / f"{name}.json"), steps=2, lr=LR, optimizer="adamw"))
    results = run_many(jobs, nproc=4, timeout_s=90)
    out = dict(zip(names, results))
    out["_checkpoint_dir"] = ckdir
    return out


@pytest.fixture(scope="session")
def two_rank_results(equality_results, tmp_path_factory):
    """One 2-rank launch: resume the 4-rank checkpoint under another plan and world size; a GQA model; a tiny
    Hugging Face decoder family under tensor parallelism; context parallelism and selective recompute."""
    from uniap.runtime.job import TrainingJob as Job
    from uniap.runtime.launch import run_many
    from uniap.runtime.plans import uniform_plan

    root = tmp_path_factory.mktemp("two")
    resume_plan = root / "llama-dp2-zero3.json"
    uniform_plan(LLAMA, 2, dp=2, zero=3).save(resume_plan)
    gqa_plan = root / "gqa-tp2.json"
    uniform_plan(GQA, 2, tp=2, micro_batches=2).save(gqa_plan)
    jobs = [Job(str(resume_plan), steps=5, lr=LR, check=True, resume=True,
                checkpoint_dir=str(equality_results["_checkpoint_dir"])),
            Job(str(gqa_plan), steps=3, lr=LR, check=True)]
    names = ["resume", "gqa"]
    for name, plan in {**family_plans(), **context_plans()}.items():
        path = root / f"{name}.json"
        plan.save(path)
        names.append(name)
        jobs.append(Job(str(path), steps=3, lr=LR, check=True))
    return dict(zip(names, run_many(jobs, nproc=2, timeout_s=90)))
