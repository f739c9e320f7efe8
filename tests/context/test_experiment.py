"""The capability and cost experiments end to end at toy size, their CLI, and their config errors."""
from __future__ import annotations

import copy
import json
import math
import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

from attnbench import cli
from attnbench import plan as planner
from attnbench.config import load_config, validate_config
from attnbench.errors import ConfigError
from attnbench.context import experiment as E
from attnbench.context.perplexity import sliding_window_score

CONFIG = Path(__file__).resolve().parents[2] / "config" / "config.yaml"
TINY_CAPABILITY = {
    "train_len": 96, "eval_factors": [1, 2], "extension_factors": [2],
    "model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "backend": "sdpa-math"},
    "pretrain": {"steps": 6, "batch_tokens": 384, "warmup_steps": 2}, "finetune": {"fraction": 0.34},
    "eval": {"tokens": 384, "stride": 48, "n_docs": 2, "batch_size": 4}, "passkey": {"n": 2, "enabled": True},
}
TINY_COST = {"cpu": {"backends": ["eager", "sdpa-math"], "groups": {
    "prefill": {"mode": ["fwd", "fwd_bwd"], "layout": "gqa", "heads_q": 2, "gqa_group": 2, "head_dim": 16,
                "seq": [64, 128], "causal": True},
    "decode": {"mode": "decode", "layout": "gqa", "heads_q": 2, "gqa_group": 2, "head_dim": 16, "seq": [128]}}}}


@pytest.fixture(scope="module")
def config():
    with open(CONFIG) as fh:
        raw = yaml.safe_load(fh)
    raw["device"] = "cpu"
    raw["stages"] = ["context"]
    raw["timing"] = {"warmup_ms": 1, "rep_ms": 2, "cpu_min_run_time_s": 0.005}
    raw["context"] = {"capability": copy.deepcopy(TINY_CAPABILITY), "cost": copy.deepcopy(TINY_COST)}
    return validate_config(raw)


def capability(config, device="cpu"):
    return planner.device_view(config, device)["context"]["capability"]


@pytest.fixture(scope="module")
def spec(config):
    return capability(config)


@pytest.fixture(scope="module")
def checkpoint(spec):
    torch.set_num_threads(1)
    return E.pretrain(spec, "cpu", log=lambda s: None)


def test_variants_per_method(spec):
    spec = {**spec, "extension_factors": [2, 4]}
    assert [(v.factor, v.finetune_steps) for v in E.variants(spec, "none")] == [(1, 0), (2, 2), (4, 2)]
    assert [v.rope_factor for v in E.variants(spec, "dynamic_ntk")] == [1, 1, 1]
    yarn = E.variants(spec, "yarn")
    assert [(v.factor, v.rope_factor, v.finetune_steps) for v in yarn] == [(2, 2, 0), (4, 4, 0), (2, 2, 2), (4, 4, 2)]
    no_ft = {**spec, "finetune": {**spec["finetune"], "enabled": False}}
    assert all(v.finetune_steps == 0 for v in E.variants(no_ft, "linear"))


def test_capability_rows_and_tables(spec, checkpoint):
    assert len(checkpoint["losses"]) == 6 and all(math.isfinite(x) for x in checkpoint["losses"])
    rows = pd.DataFrame(E.evaluate(checkpoint, spec, "yarn", "cpu", log=lambda s: None)
                        + E.evaluate(checkpoint, spec, "none", "cpu", log=lambda s: None))
    assert (rows["status"] == "ok").all()
    # yarn: s=2 without and with fine-tune; none: s=1, and s=2 fine-tuned; each at 2 lengths x 3 evaluations
    assert len(rows) == 4 * 2 * 3
    ppl = rows[rows["eval"] != "passkey"]["ppl"]
    assert ppl.between(1, 256).all()
    assert set(rows[rows["eval"] == "passkey"]["accuracy"]) <= {0.0, 0.5, 1.0}
    tuned = rows[(rows["finetune_steps"] > 0)]
    assert (tuned["finetune_len"] == 192).all() and tuned["finetune_final_loss"].notna().all()

    # the no-fine-tune "none" variant is the pretrained model itself: same score when recomputed directly
    model = E.extended_model(checkpoint, spec, E.Variant("none", 1.0, 0), "cpu", 96)
    text = E.load_data(spec).val[:384].long()
    direct = sliding_window_score(lambda t: model(t), text, 96, 48, 4)
    row = rows[(rows["method"] == "none") & (rows["finetune_steps"] == 0) & (rows["eval_len"] == 96)
               & (rows["eval"] == "sliding")].iloc[0]
    assert row["ppl"] == pytest.approx(direct.ppl, rel=1e-5)

    from attnbench.report.context import passkey_table, perplexity_table
    table = perplexity_table(rows, "truncated")
    assert list(table.columns[-2:]) == ["96", "192"] and len(table) == 4
    assert len(passkey_table(rows)) == 4


def test_extension_keeps_weights_and_changes_only_rope(spec, checkpoint):
    yarn = E.extended_model(checkpoint, spec, E.Variant("yarn", 2.0, 0), "cpu", 192)
    assert yarn.cfg.rope.method == "yarn" and yarn.cfg.rope.factor == 2.0 and yarn.attention_factor > 1
    assert all(torch.equal(p, checkpoint["state_dict"][k]) for k, p in yarn.state_dict().items())


def test_original_length_beyond_the_model_is_an_error(spec, checkpoint):
    with pytest.raises(ConfigError, match=r"rope.original_max_len=192 is larger than the model's length 96"):
        E.extended_model(checkpoint, {**spec, "train_len": 192}, E.Variant("linear", 2.0, 0), "cpu", 384)


@pytest.mark.parametrize("change, message", [
    ({"extension_factors": [0.5]}, "context.capability.extension_factors.0"),
    ({"methods": ["pi"]}, "context.capability.methods.0='pi' is not allowed; allowed: none, linear"),
    ({"rope": {"beta_fast": 1.0, "beta_slow": 2.0}}, "rope.beta_fast"),
    ({"cuda": {"pretrain": {"steps": 0}}}, "context.capability.cuda.pretrain.steps"),
    ({"cuda": {"bogus": 1}}, "context.capability.cuda: unknown key 'bogus'"),
    ({"train_len": 32}, "context.capability.passkey.enabled"),
])
def test_bad_context_config_names_the_key(config, change, message):
    raw = copy.deepcopy(config)
    raw["context"]["capability"].update(change)
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("(", r"\(")):
        planner.check_config(validate_config(raw))


def test_cuda_block_is_merged_on_cuda_only(config):
    raw = copy.deepcopy(config)
    raw["context"]["capability"]["cuda"] = {"train_len": 1024, "eval": {"stride": 256}}
    assert capability(raw)["train_len"] == 96
    cuda = capability(raw, "cuda")
    assert cuda["train_len"] == 1024 and cuda["eval"]["stride"] == 256 and "cuda" not in cuda


def test_cli_end_to_end(tmp_path, config, checkpoint):
    plan = planner.build_plan(config)
    plan.write_jobs(tmp_path / "plan")
    job = tmp_path / "plan" / "context"
    torch.save(checkpoint, tmp_path / "ck.pt")
    assert cli.main(["context", "evaluate", "--job", str(job / "capability-dynamic_ntk.json"), "--checkpoint",
                     str(tmp_path / "ck.pt"), "--threads", "1", "--out", str(tmp_path / "dyn.parquet")]) == 0
    (tmp_path / "ceilings.json").write_text('{"device": "cpu", "device_name": "test", "copy_bytes_per_s": 1e10, '
                                            '"matmul_flops_per_s": {"fp32": 1e11}}')
    for group in ("prefill", "decode"):
        assert cli.main(["microbench", "--job", str(tmp_path / "plan" / "context-cost" / f"{group}.json"),
                         "--ceilings", str(tmp_path / "ceilings.json"),
                         "--out", str(tmp_path / f"cost-{group}.parquet")]) == 0
    assert cli.main(["context", "rope-overhead", "--job", str(job / "rope-overhead.json"),
                     "--out", str(tmp_path / "rope.parquet")]) == 0
    results = tmp_path / "results" / "s"  # a sweep folder: merged parts, then the stage's tables
    (results / "context").mkdir(parents=True)
    shutil.copy(tmp_path / "rope.parquet", results / "context" / "rope_overhead.parquet")
    assert cli.main(["context", "merge", "--capability", str(tmp_path / "dyn.parquet"), "--cost",
                     str(tmp_path / "cost-prefill.parquet"), str(tmp_path / "cost-decode.parquet"),
                     "--out-capability", str(results / "context" / "capability.parquet"),
                     "--out-cost", str(results / "context" / "cost.parquet")]) == 0
    assert cli.main(["tables", "context", "--results", str(results)]) == 0

    cost = pd.read_parquet(results / "context" / "cost.parquet")
    assert len(cost) == (4 + 1) * 2 and (cost["status"] == "ok").all() and cost["ms_median"].gt(0).all()
    assert set(cost["bound"]) <= {"memory", "compute", "latency"} and cost["rel_err"].isna().all()
    rope = pd.read_parquet(tmp_path / "rope.parquet")
    assert set(rope["method"]) == {"none", "linear", "ntk", "dynamic_ntk", "yarn", "llama3"}
    assert sorted(set(rope["seq"])) == [64, 128] and rope["tables_ms"].gt(0).all()
    index = json.loads((results / "context" / "tables" / "index.json").read_text())
    assert [t["name"] for t in index["tables"]] == ["perplexity_sliding", "perplexity_truncated", "passkey", "cost",
                                                   "rope_overhead"]
    assert [f["name"] for f in index["figures"]] == ["perplexity"]
    for entry in index["tables"]:
        text = (results / "context" / entry["files"]["md"]).read_text()
        assert text.count("\n") >= 3, entry["name"]
    assert not any(t["empty"] for t in index["tables"] if t["name"] != "passkey")  # passkey is off on a CPU
    assert "dynamic NTK" in (results / "context" / "tables" / "perplexity_sliding.md").read_text()


def test_cli_bad_job_is_one_line(tmp_path, capsys):
    assert cli.main(["context", "rope-overhead", "--job", str(tmp_path / "nope.json"),
                     "--out", str(tmp_path / "x.parquet")]) == 2
    assert "job file" in capsys.readouterr().err and not (tmp_path / "x.parquet").exists()


def test_loaded_default_config_is_cpu_sized():
    spec = capability(load_config(CONFIG))
    assert 128 <= spec["train_len"] <= 512 and spec["eval_factors"] == [1, 2, 4, 8]
    assert spec["finetune"]["fraction"] <= 0.1
