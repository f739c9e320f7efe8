"""The context_parallel section -> jobs: one per world size, every row planned once, one-line errors
naming the key for every bad value, a cuda block's groups replacing the CPU groups."""
import copy

import pytest

from attnbench.config import validate_config
from attnbench.errors import ConfigError
from attnbench.plan import build_plan, device_view

BASE = {"sweep": "t", "stages": ["context_parallel"],
        "microbench": {"cpu": {"backends": ["eager"], "groups": {"g": {"seq": 64}}},
                       "cuda": {"backends": ["eager"], "groups": {"g": {"seq": 64}}}}}
GROUP = {"mode": ["fwd", "fwd_bwd"], "layout": "gqa", "heads_q": 4, "gqa_group": 2, "head_dim": 32,
         "seq": [64, 128], "causal": True, "dtype": "fp32"}


def plan_of(section: dict, device: str = "cpu"):
    config = validate_config({**copy.deepcopy(BASE), "context_parallel": section})
    return build_plan(config, device)


def test_one_job_per_world_size_with_every_row_once():
    plan = plan_of({"world_sizes": [1, 2, 4], "backends": ["ring-math", "torch-cp-alltoall"],
                    "groups": {"g": GROUP}})
    jobs = {j.name: j.payload for j in plan.context_parallel}
    assert list(jobs) == ["n1", "n2", "n4"] and [j.stage for j in plan.jobs()] == ["context_parallel"] * 3
    # N=1 runs each case once (every sharding is one layout on one rank)
    assert {i["sharding"] for i in jobs["n1"]["items"]} == {"contiguous"} and len(jobs["n1"]["items"]) == 4 * 2
    assert len(jobs["n4"]["items"]) == 4 * 3 * 2  # cases x shardings x backends
    ids = [i["row_id"] for job in jobs.values() for i in job["items"]]
    assert len(ids) == len(set(ids))
    lengths = [i["case"]["seq_kv"] for i in jobs["n2"]["items"]]
    assert lengths == sorted(lengths)
    assert jobs["n2"]["settings"]["reps"] == 5 and jobs["n2"]["world_size"] == 2


def test_group_narrows_backends_shardings_world_sizes_and_packs_documents():
    group = {**GROUP, "seq": 128, "mode": "fwd_bwd", "backends": ["ring-sdpa-flash"], "shardings": ["zigzag"],
             "world_sizes": [2], "documents": {"distribution": "uniform", "mean": 20, "seed": 1}}
    plan = plan_of({"world_sizes": [1, 2], "groups": {"docs": group}})
    jobs = {j.name: j.payload for j in plan.context_parallel}
    assert jobs["n1"]["items"] == []
    (item,) = jobs["n2"]["items"]
    assert (item["backend"], item["sharding"]) == ("ring-sdpa-flash", "zigzag") and sum(item["documents"]) == 128


def test_cuda_groups_replace_the_cpu_groups():
    section = {"groups": {"cpu-only": GROUP},
               "cuda": {"world_sizes": [1, 8], "groups": {"gpu": {**GROUP, "seq": 4096}}}}
    config = validate_config({**copy.deepcopy(BASE), "context_parallel": section})
    view = device_view(config, "cuda")["context_parallel"]
    assert list(view["groups"]) == ["gpu"] and view["world_sizes"] == [1, 8]
    assert list(device_view(config, "cpu")["context_parallel"]["groups"]) == ["cpu-only"]


@pytest.mark.parametrize("section,message", [
    ({"backends": ["ring-nope"], "groups": {"g": GROUP}},
     "context_parallel.backends: backend='ring-nope' is not known; allowed: ring-math, ring-sdpa-flash"),
    ({"world_sizes": [3], "groups": {"g": {**GROUP, "seq": 75}}},
     "context_parallel.groups.g: fwd gqa B1 Hq4 Hkv2 Sq75 Skv75 D32/32 causal fp32: sequence length 75 is not "
     "allowed for zigzag sharding over 3 ranks; allowed: a positive multiple of 6"),
    ({"groups": {"g": {**GROUP, "mode": "decode"}}}, "allowed: mode fwd or fwd_bwd with seq_q == seq_kv"),
    ({"groups": {"g": {**GROUP, "shards": 2}}}, "context_parallel.groups.g: unknown key 'shards'; allowed:"),
    ({"groups": {"g": {**GROUP, "shardings": ["ring"]}}},
     "context_parallel.groups.g.shardings=['ring'] is not allowed; allowed: a non-empty list of contiguous"),
    ({"groups": {"g": {**GROUP, "world_sizes": [16]}}},
     "context_parallel.groups.g.world_sizes=[16] is not allowed; allowed: a non-empty list of the section's"),
    ({"groups": {"g": {**GROUP, "seq": 64, "documents": {"lengths": [30, 30]}}}},
     "context_parallel.groups.g.documents: document lengths sum to 60; allowed: lengths that sum to the sequence"),
    ({"groups": {"g": {**GROUP, "documents": {"mean": 8}}}},
     "context_parallel.groups.g.documents: give lengths, or distribution and mean"),
    ({"groups": {"g": {**GROUP, "documents": {"distribution": "zipf", "mean": 8}}}},
     "distribution='zipf' is not allowed; allowed: lognormal, uniform, fixed"),
    ({"shardings": ["stripes"], "groups": {"g": GROUP}},
     "context_parallel.shardings.0='stripes' is not allowed; allowed: contiguous, zigzag, striped"),
])
def test_bad_values_are_one_line_errors_before_any_job(section, message):
    with pytest.raises(ConfigError) as err:
        plan_of(section)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_the_cuda_block_is_checked_on_a_cpu_host():
    with pytest.raises(ConfigError, match="context_parallel.cuda: unknown key 'repz'"):
        plan_of({"cuda": {"repz": 3}})


def test_a_group_with_a_workload_or_variant_key_is_refused():
    group = {"mode": "fwd", "heads_q": 4, "head_dim": 16, "seq": 64, "causal": True, "variant": "sliding_window",
             "window": 16}
    with pytest.raises(ConfigError, match=r"context_parallel\.groups\.g: variant, window is not allowed"):
        plan_of({"groups": {"g": group}})
