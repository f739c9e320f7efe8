"""The planner and the config loader: one-line errors before any work, extends chains, jobs as data."""
import json
import os
from pathlib import Path

import pytest
import yaml

from attnbench import config as configs
from attnbench import plan as planner
from attnbench.bench.schema import results_schema_text
from attnbench.errors import ConfigError
from attnbench.kernels.registry import backend_names
from tests.helpers import with_key

REPO = Path(__file__).resolve().parents[1]
CONFIG = {
    "sweep": "unit",
    "device": "cpu",
    "stages": ["microbench"],
    "timing": {"cpu_min_run_time_s": 0.01},
    "microbench": {
        "cpu": {"backends": ["eager", "sdpa-math"], "rule_backends": {"c-naive": ["g"]},
                "groups": {"g": {"mode": ["fwd", "decode"], "heads_q": 2, "head_dim": 16, "seq": 32,
                                 "dtype": ["fp32", "bf16"]},
                           "flexonly": {"backends": ["flex"], "heads_q": 2, "head_dim": 16, "seq": 32}}},
        "cuda": {"backends": ["sdpa-flash"], "groups": {"g": {"seq": 64}}},
    },
}
RULE_FILES = [p.stem for p in (REPO / "workflow" / "rules" / "backends").glob("*.smk")]


def _with(path: str, value, base=CONFIG):
    return with_key(base, path, value)


def _plan(config, device=None):
    return planner.build_plan(configs.validate_config(config), device, RULE_FILES)


def test_plan_lists_jobs_and_says_why_this_grid():
    plan = _plan(CONFIG)
    assert plan.device == "cpu" and plan.config["device"] == "cpu"
    jobs = [(j.stage, j.name) for j in plan.jobs()]
    assert jobs == [("microbench", "g"), ("microbench", "flexonly"), ("microbench-rule", "c-naive/g")]
    job = plan.job("microbench", "g").payload
    assert job["backends"] == ["eager", "sdpa-math"] and len(job["cases"]) == 4
    assert job["options"]["cpu_min_run_time_s"] == 0.01 and job["options"]["numerics"] is True
    assert "runs the cpu grid (device: cpu in the config)" in plan.summary()
    assert "jobs per stage: microbench 2, microbench-rule 1" in plan.summary()


def test_timed_jobs_get_the_rounds_and_telemetry_options_of_their_device():
    options = _plan(CONFIG).job("microbench", "g").payload["options"]
    assert options["repeats"] == planner.DEFAULT_REPEATS["cpu"] == 3
    assert (options["discard_throttled"], options["cooldown_ms"], options["energy_ms"]) == (False, 0, 500)
    cuda = planner.run_options(planner.device_view(configs.validate_config(CONFIG), "cuda"))
    assert cuda["repeats"] == 5 and cuda["telemetry_ms"] == 20
    assert _plan(_with("timing.repeats", 7)).job("microbench", "g").payload["options"]["repeats"] == 7
    stability = _plan(_with("stability", {"groups": ["g"], "processes": 2}, _with("stages", ["stability"])))
    passes = [j for j in stability.jobs() if j.stage == "stability"]
    assert [j.name for j in passes] == ["g/1", "g/2"] and passes[0].payload["options"]["numerics"] is False


def test_a_stage_the_sweep_does_not_run_plans_no_jobs_but_is_still_checked():
    plan = _plan(_with("stages", ["pretrain"]))
    assert {j.stage for j in plan.jobs()} == {"pretrain"}
    with pytest.raises(ConfigError, match="backend='fa9' is not known"):
        _plan(_with("stages", ["pretrain"], _with("microbench.cpu.backends", ["fa9"])))


@pytest.mark.parametrize("path, value, message", [
    ("bogus", 1, "unknown key 'bogus'; allowed: sweep, sources, device"),
    ("microbench.cpu.backends", ["eager", "fa9"], "backend='fa9' is not known; allowed: eager, flex, sdpa-math"),
    ("microbench.cuda.backends", ["fa9"], "microbench.cuda.backends: backend='fa9' is not known"),
    ("microbench.cpu.groups", {"g": {"mode": "fwd", "seq": 32, "layout": "gqa", "heads_q": 6, "gqa_group": 4}},
     "gqa_group=4 is not allowed with heads_q=6"),
    ("microbench.cpu.groups", {"g": {"seq": []}}, "microbench.cpu.groups.g.seq=[] is not allowed"),
    ("microbench.cpu.groups", {"g": {"seq": 32, "causal": "false"}}, "causal='false' is not allowed; allowed: true or false"),
    ("microbench.cpu.groups", {"g": {"seq": 32.5}}, "seq=32.5 is not allowed; allowed: an integer >= 1"),
    ("microbench.cpu.groups", {}, "microbench.cpu.groups"),
    ("microbench.cpu.groups", {"g": {"grids": [{"seq": 32}], "seq": 64}}, "grid key 'seq' next to grids"),
    ("microbench.cpu.rule_backends", {"cuda-thing": ["g"]}, "'cuda-thing' has no rule file"),
    ("microbench.cpu.rule_backends", {"c-naive": ["nope"]}, "group='nope' is not in this plan's groups"),
    ("microbench.cpu.rule_backends", {"eager": ["g"]}, "'eager' is a Python adapter's name"),
    ("microbench.cpu.groups.flexonly.backends", ["eager"], "runs on eager in both 'g' and 'flexonly'"),
    ("stability.groups", ["nope"], "stability.groups: 'nope' is not a group of microbench.cpu or microbench.cuda"),
    ("pretrain.model.backend", "fa9", "names backend='fa9', which is not known; allowed: auto, eager"),
    ("pretrain.cuda.model.backend", "fa9", "backend='fa9', which is not known"),
    ("pretrain.cuda.train.steps", 0, "pretrain.cuda.train.steps=0 is not allowed; allowed: an integer from 1 to 10000000"),
    ("pretrain.experiments.fp8.seeds", [1, 1],
     "pretrain.experiments.fp8.seeds=[1, 1] is not allowed; allowed: a list of 1 to 100 distinct items"),
    ("pretrain.train.backend_candidates", [], "backend_candidates=[] is not allowed; allowed: a list of at least one item"),
    ("pretrain.select.runs", ["fp8/nope"], "pretrain.select.runs: 'fp8/nope' is not a planned run"),
    ("pretrain.experiments.lr_sensitivity.variants", {"v": {"model": {"qk_nrm": True}}}, "unknown key 'qk_nrm'"),
    ("context.capability.model", {"d_modl": 8}, "context.capability.model: unknown key 'd_modl'"),
    ("context.capability.eval_factors", [1, 1000], "eval_factors: 1000 is not allowed"),
    ("context.cost.cuda.backends", ["fa9"], "context.cost.cuda.backends: backend='fa9' is not known"),
    ("hbm.groups", {"bad name": {"seq": 8}}, "hbm.groups"),
    ("sweep", "../escape", "sweep='../escape' is not allowed; allowed: a name matching"),
    ("max_err_ratio", float("nan"), "max_err_ratio=nan is not allowed; allowed: a finite number"),
    ("seed", 2 ** 70, "seed"),
    ("timing.repeats", 0, "timing.repeats=0 is not allowed; allowed: an integer from 1 to 50, or null"),
    ("timing.cooldown_ms", -1, "timing.cooldown_ms=-1 is not allowed; allowed: a number from 0 to"),
    ("report.min_margin", "3%", "report.min_margin='3%' is not allowed; allowed: a number from 0 to 10"),
    ("baseline", "/etc/passwd", "baseline='/etc/passwd' is not allowed; allowed: a relative path under results/"),
    ("baseline", "results/../../x", "baseline='results/../../x' is not allowed"),
])
def test_bad_configs_are_one_line_errors(path, value, message):
    with pytest.raises(ConfigError) as err:
        _plan(_with(path, value))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_grid_over_max_cases_is_refused_before_it_is_built():
    huge = {"seq": list(range(1, 201)), "batch": list(range(1, 101)), "heads_q": [1, 2]}  # 40,000 points
    with pytest.raises(ConfigError, match="the grid has 40000 points; allowed: at most max_cases=10000"):
        _plan(_with("microbench.cpu.groups", {"g": huge}))


def test_grids_lists_keep_batch_times_length_constant():
    group = {"grids": [{"batch": 4096 // s, "seq": s, "heads_q": 2, "head_dim": 16} for s in (256, 512, 1024)]}
    plan = _plan(_with("microbench.cpu.groups", {"g": group}, _with("microbench.cpu.rule_backends", {})))
    cases = plan.group("microbench", "g").cases
    assert [(c.batch, c.seq_kv) for c in cases] == [(16, 256), (8, 512), (4, 1024)]


def test_extends_merges_mappings_replaces_lists_and_records_the_chain(tmp_path):
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(CONFIG))
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "child.yaml").write_text(yaml.safe_dump(
        {"extends": "../base.yaml", "sweep": "child", "timing": {"rep_ms": 7},
         "microbench": {"cpu": {"backends": ["eager"]}}}))
    config = configs.load_config(tmp_path / "sub" / "child.yaml")
    assert config["sweep"] == "child" and config["timing"] == {**config["timing"], "rep_ms": 7, "cpu_min_run_time_s": 0.01}
    assert config["microbench"]["cpu"]["backends"] == ["eager"]  # a list replaces
    assert set(config["microbench"]["cpu"]["groups"]) == {"g", "flexonly"}  # a mapping merges
    assert [Path(s).name for s in config["sources"]] == ["base.yaml", "child.yaml"]


def test_extends_refuses_cycles_and_missing_files(tmp_path):
    (tmp_path / "a.yaml").write_text("extends: b.yaml\n")
    (tmp_path / "b.yaml").write_text("extends: a.yaml\n")
    with pytest.raises(ConfigError, match="extends it back"):
        configs.load_config(tmp_path / "a.yaml")
    (tmp_path / "c.yaml").write_text("extends: nowhere.yaml\n")
    with pytest.raises(ConfigError, match="nowhere.yaml' does not exist"):
        configs.load_config(tmp_path / "c.yaml")


@pytest.mark.parametrize("text, message", [
    ("a: &x [1]\nb: *x\n", "YAML anchors (&x) are not allowed"),
    ("sweep: a\nsweep: b\n", "key 'sweep' appears twice in one mapping"),
    ("- 1\n- 2\n", "holds a list; allowed: a mapping"),
    ("sweep: [unclosed\n", "not valid YAML"),
])
def test_yaml_is_read_with_limits(tmp_path, text, message):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        configs.read_yaml(path)


def test_a_config_over_the_size_limit_or_not_text_is_refused(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_text("x: " + "1" * (configs.MAX_CONFIG_BYTES + 1))
    with pytest.raises(ConfigError, match="allowed: a config of at most"):
        configs.read_yaml(big)
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"\xff\xfe\x00\x01")
    with pytest.raises(ConfigError, match="not UTF-8 text"):
        configs.read_yaml(binary)


def test_job_files_are_rewritten_only_when_their_content_changes(tmp_path):
    plan = _plan(CONFIG)
    paths = plan.write_jobs(tmp_path)
    job = tmp_path / "microbench" / "g.json"
    assert job in paths and json.loads(job.read_text())["group"] == "g"
    os.utime(job, (1, 1))
    plan.write_jobs(tmp_path)
    assert job.stat().st_mtime == 1  # unchanged: Snakemake does not rerun the job
    # adding a backend to one group changes only that group's job file
    other = _plan(_with("microbench.cpu.groups.flexonly.backends", ["flex", "sdpa-flash"]))
    os.utime(tmp_path / "microbench" / "flexonly.json", (1, 1))
    other.write_jobs(tmp_path)
    assert job.stat().st_mtime == 1 and (tmp_path / "microbench" / "flexonly.json").stat().st_mtime > 1


def test_read_job_names_the_file_for_anything_that_is_not_a_job(tmp_path):
    bad = tmp_path / "job.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="job.json: not a job file"):
        planner.read_job(bad, ("microbench",))
    bad.write_text(json.dumps({"stage": "hbm"}))
    with pytest.raises(ConfigError, match="stage='hbm' is not allowed here; allowed: microbench"):
        planner.read_job(bad, ("microbench",))


@pytest.mark.parametrize("path", [REPO / "config" / "config.yaml", *sorted((REPO / "config" / "sweeps").glob("*.yaml"))],
                         ids=lambda p: p.name)
def test_shipped_configs_plan_on_every_device(path):
    plans = planner.check_config(configs.load_config(path), RULE_FILES)
    assert set(plans) == {"cpu", "cuda"} and all(p.jobs() for p in plans.values() if p.stages)


def test_the_default_gpu_grid_names_every_registered_backend():
    config = configs.load_config(REPO / "config" / "config.yaml")
    assert set(config["microbench"]["cuda"]["backends"]) == set(backend_names())


def test_committed_results_schema_is_the_generated_one():
    assert (REPO / "workflow" / "schemas" / "results.schema.yaml").read_text() == results_schema_text()
    link = REPO / "workflow" / "schemas" / "config.schema.yaml"
    assert link.is_symlink() and link.resolve() == (REPO / "attnbench" / "schemas" / "config.schema.yaml").resolve()


def test_the_start_line_gives_jobs_per_stage_and_the_time_earlier_runs_took(tmp_path):
    plan = _plan(CONFIG)
    assert "earlier" not in plan.summary(tmp_path) and "took" not in plan.summary(tmp_path)
    (tmp_path / "microbench").mkdir()
    (tmp_path / "microbench" / "g.tsv").write_text("s\th:m:s\tmax_rss\n90.0\t0:01:30\t1\n")
    assert plan.summary(tmp_path).endswith("; 1 of 3 jobs took 1.5 min together when this sweep last ran them")


def test_config_readme_documents_every_key():
    from attnbench.workloads.grid import GRID_KEYS

    readme = (REPO / "config" / "README.md").read_text()
    top = configs.load_schema()
    keys = [f"`{k}`" for k in top["properties"] if k != "timing"] + ["`extends`"]
    for section in ("timing", "slurm"):
        keys += [f"`{section}.{k}`" for k in top["properties"][section]["properties"]]
    keys += [f"`{k}`" for k in top["$defs"]["plan"]["properties"]] + [f"`{k}`" for k in GRID_KEYS]
    for section in ("report", "stability", "triton"):
        schema = configs.load_schema(section)
        for key, sub in schema["properties"].items():
            inner = sub.get("properties")
            keys += [f"`{section}.{key}.{k}`" for k in inner] if inner else [f"`{section}.{key}`"]
    keys += [f"`pretrain.{k}`" for k in ("cuda", "time_limit_s", "compile_fallback")]
    keys += [f"`pretrain.select.{k}`" for k in configs.load_schema("pretrain")["properties"]["select"]["properties"]]
    missing = [k for k in keys if k not in readme]
    assert not missing, f"config/README.md does not document {missing}"


def test_structured_command_line_overrides_are_typed_as_yaml_types_them():
    # what Snakemake hands over for --config seed=3 'stages=[microbench]' 'timing={rep_ms: 7, warmup_ms: 2.5}'
    raw = {"seed": 3, "stages": ["microbench"], "timing": {"rep_ms": "7", "warmup_ms": "2.5"}, "sweep": "x"}
    assert configs.command_line_overrides(raw) == {"seed": 3, "stages": ["microbench"], "sweep": "x",
                                                   "timing": {"rep_ms": 7, "warmup_ms": 2.5}}
