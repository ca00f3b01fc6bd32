"""Plans as other engines' configurations: torchtitan (job TOML), Megatron-LM (launch flags), DeepSpeed (config
JSON). `capability` says what each engine can express; a plan it cannot run is refused in one line."""

from __future__ import annotations

from types import ModuleType

from uniap.errors import UniapError
from uniap.export import deepspeed, megatron, torchtitan
from uniap.export.capability import EngineRules, job_of, refuse_unless_runnable
from uniap.plans import Plan

ENGINES: dict[str, ModuleType] = {"torchtitan": torchtitan, "megatron": megatron, "deepspeed": deepspeed}


def engine_module(name: str) -> ModuleType:
    if name not in ENGINES:
        raise UniapError(f"unknown engine {name!r} (choose {', '.join(ENGINES)})")
    return ENGINES[name]


def engine_rules(name: str) -> EngineRules:
    return engine_module(name).RULES


def export_plan(plan: Plan, engine: str) -> str:
    """The engine's configuration of `plan`, or UniapError saying what the engine cannot run of it."""
    module = engine_module(engine)
    job = job_of(plan)
    refuse_unless_runnable(module.RULES, job)
    return module.write(job)
