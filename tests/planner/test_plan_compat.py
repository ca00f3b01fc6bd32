"""Plans written before the decoder families' options existed still load, and keep their fingerprint."""

import dataclasses
from pathlib import Path

from uniap.plans import Plan
from uniap.spec.model import architecture_id

OLD = Path(__file__).resolve().parents[1] / "data" / "plans" / "plan-v1-llama2-7b.json"


def test_a_plan_from_before_the_family_options_loads():
    plan = Plan.load(OLD)  # refused with "fingerprint does not match" if the hash took the new fields
    assert plan.model_config().qkv_bias is False  # implied by bias=False
    config, seq_len = plan.model_config(), int(plan.model.seq_len)
    assert architecture_id(config, seq_len, plan.world_size) == plan.fingerprint == "80098356933c6ef0"
    assert architecture_id(dataclasses.replace(config, qk_norm="head"), seq_len, plan.world_size) != plan.fingerprint
