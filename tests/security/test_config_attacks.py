"""Attacks through the config: YAML bombs, names that leave results/, loose types, errors found late.

Each one is refused at planning time (what Snakemake's parse and `attnbench plan` run) with one line
naming the key and what is allowed, before any job starts (docs/security.md)."""
import time

import pytest

from attnbench import config as configs
from attnbench.errors import NAME_PATTERN, ConfigError
from attnbench.workflow import paths

from .conftest import CONFIG, plan_of, refused, with_


def _read(tmp_path, text: str | bytes, name: str = "c.yaml"):
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ConfigError) as err:
        configs.load_config(path)
    assert "\n" not in str(err.value)
    return str(err.value)


# ----------------------------------------------------------------------------------------------- YAML

def test_yaml_alias_bomb_is_refused_before_it_expands(tmp_path):
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    levels += [f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, "
               f"*a{i - 1}, *a{i - 1}]" for i in range(1, 9)]  # 10^9 strings if expanded
    start = time.perf_counter()
    message = _read(tmp_path, "\n".join(levels) + "\n")
    assert "anchors (&a0) are not allowed" in message and time.perf_counter() - start < 5


def test_yaml_alias_without_anchor_text_is_refused(tmp_path):
    assert "aliases (*x) are not allowed" in _read(tmp_path, "sweep: *x\n")


def test_duplicate_yaml_key_is_refused_not_silently_the_last(tmp_path):
    assert "key 'seed' appears twice" in _read(tmp_path, "seed: 1\nseed: 2\n")


def test_a_config_over_the_size_limit_is_refused_unread(tmp_path):
    assert f"allowed: a config of at most {configs.MAX_CONFIG_BYTES} bytes" in _read(
        tmp_path, b"#" * (configs.MAX_CONFIG_BYTES + 1))


def test_a_binary_config_is_one_line(tmp_path):
    assert "not UTF-8 text" in _read(tmp_path, bytes(range(256)) * 4)


def test_a_config_that_is_not_a_mapping_is_one_line(tmp_path):
    assert "holds a list; allowed: a mapping" in _read(tmp_path, "- a\n- b\n")


def test_an_extends_cycle_is_refused(tmp_path):
    (tmp_path / "b.yaml").write_text("extends: c.yaml\n")
    assert "which extends it back" in _read(tmp_path, "extends: b.yaml\n", "c.yaml")


def test_an_extends_chain_deeper_than_the_limit_is_refused(tmp_path):
    for i in range(configs.MAX_EXTENDS_DEPTH + 1):
        (tmp_path / f"e{i}.yaml").write_text(f"extends: e{i + 1}.yaml\n")
    assert f"allowed: at most {configs.MAX_EXTENDS_DEPTH}" in _read(tmp_path, "extends: e0.yaml\n", "top.yaml")


def test_a_grid_of_a_million_cases_is_refused_before_it_is_expanded():
    grid = {"mode": "fwd", "seq": list(range(1, 101)), "batch": list(range(1, 101)), "heads_q": list(range(1, 101))}
    start = time.perf_counter()
    refused(with_("microbench.cpu.groups", {"huge": grid}), "max_cases=10000")
    assert time.perf_counter() - start < 10


def test_a_synthetic_corpus_table_too_big_for_memory_is_refused():
    refused(with_("stages", ["pretrain"], with_("pretrain.data", {"source": "synthetic", "synthetic": {
        "vocab": 64, "order": 8}})), "vocab ** order <= 1048576")


def test_evaluation_lengths_far_beyond_the_training_length_are_refused():
    refused(with_("context.capability.eval_factors", [1, 1000]), "allowed: factors up to 64")


# ----------------------------------------------------------------------------------------------- names -> paths

@pytest.mark.parametrize("key, value", [
    ("sweep", ".."), ("sweep", "/etc"), ("sweep", ""), ("sweep", "a b"), ("sweep", "x" * 65),
    ("sweep", "a;rm -rf ~"), ("sweep", "$(touch x)"),
])
def test_a_sweep_name_that_could_leave_results_or_reach_a_shell_is_refused(key, value):
    refused(with_(key, value), f"{key}={value!r} is not allowed; allowed: a name matching {NAME_PATTERN.pattern}")


@pytest.mark.parametrize("group", ["../up", "a/b", "-flag", "`id`", "a b"])
def test_a_group_name_that_could_leave_results_is_refused(group):
    grid = CONFIG["microbench"]["cpu"]["groups"]["g"]
    refused(with_("microbench.cpu.groups", {group: grid}), "microbench.cpu.groups", "is not allowed")


def test_an_lr_sensitivity_variant_name_that_becomes_a_run_folder_is_refused():
    refused(with_("pretrain.experiments.lr_sensitivity.variants", {"../../escape": {}}),
            "pretrain.experiments.lr_sensitivity.variants='../../escape' is not allowed")


def test_a_layouts_entry_name_that_becomes_a_run_folder_is_refused():
    refused(with_("pretrain.experiments.layouts.layouts", {"../x": {"layout": "mha"}}),
            "pretrain.experiments.layouts.layouts='../x' is not allowed")


def test_a_rule_backend_name_with_shell_words_is_refused():
    refused(with_("microbench.cpu.rule_backends", {"c-naive; id": ["g"]}), "is not allowed")


@pytest.mark.parametrize("key, value", [("report.wandb.project", "a/b"), ("report.wandb.project", "x;y"),
                                        ("report.wandb.entity", "team name"), ("report.wandb.tags", ["a\nb"]),
                                        ("report.wandb.tags", ["x" * 65])])
def test_wandb_names_and_tags_outside_wandbs_rules_are_refused(key, value):
    refused(with_(key, value), key.split(".")[-1])


@pytest.mark.parametrize("key, value", [
    ("report.wandb.entity", "team name"), ("slurm.partition", "gpu;id"), ("slurm.account", "../x"),
    ("stability.groups", ["g", "a b"]), ("triton.groups", ["$(id)"]),
])
def test_every_section_refuses_a_bad_name_with_the_one_pattern(key, value):
    # a name or null (entity, partition, account) names the pattern, not "not valid under any of the given schemas"
    shown = f"{value[-1]!r}" if isinstance(value, list) else f"{value!r}"
    refused(with_(key, value), f"={shown} is not allowed; allowed: a name matching {NAME_PATTERN.pattern}")


def test_a_value_of_no_allowed_type_names_the_types():
    refused(with_("slurm.partition", 3), "slurm.partition=3 is not allowed; allowed: string or null")


def test_the_schemas_hold_the_name_pattern_once_and_it_is_the_pythons():
    from importlib.resources import files

    from attnbench.config import load_schema

    texts = {p.name: p.read_text() for p in (files("attnbench") / "schemas").iterdir() if p.name.endswith(".yaml")}
    holders = {name: text.count(NAME_PATTERN.pattern) for name, text in texts.items() if NAME_PATTERN.pattern in text}
    assert holders == {"config.schema.yaml": 1}  # every other place refers to config.schema.yaml#/$defs/name
    assert load_schema()["$defs"]["name"]["pattern"] == NAME_PATTERN.pattern


def test_an_ncu_metric_that_would_split_the_metrics_list_is_refused():
    refused(with_("hbm.extra_metrics", ["dram__bytes.sum,--launch-skip 0"]), "hbm.extra_metrics.0")


def test_every_path_of_a_sweep_stays_under_its_two_folders():
    for name in dir(paths):
        if name.isupper() and isinstance(getattr(paths, name), str):
            path = getattr(paths, name).format(sweep="s", group="g", backend="b", stage="microbench", name="n",
                                               index=1, experiment="e", method="m", world=2)
            assert (path + "/").startswith(("results/s/", "reports/s/")) and ".." not in path, (name, path)


# ----------------------------------------------------------------------------------------------- loose types

@pytest.mark.parametrize("key, value, fragment", [
    ("numerics", "false", "numerics='false' is not allowed; allowed: true or false"),
    ("max_err_ratio", float("nan"), "max_err_ratio=nan is not allowed; allowed: a finite number"),
    ("timing.cpu_min_run_time_s", float("inf"), "timing.cpu_min_run_time_s=inf is not allowed"),
    ("seed", 2 ** 70, "seed=1180591620717411303424 is not allowed; allowed: an integer from 0 to 2147483647"),
    ("pretrain.train.init_seed", 2 ** 70, "pretrain.train.init_seed=1180591620717411303424 is not allowed; allowed: an integer from 0"),
    ("context.capability.seed", -1, "context.capability.seed=-1 is not allowed; allowed: an integer from 0"),
    ("pretrain.model.d_model", 10 ** 9, "pretrain.model.d_model=1000000000 is not allowed; allowed: an integer from 1 to 65536"),
    ("pretrain.train.compile", "yes", "pretrain.train.compile='yes' is not allowed; allowed: true or false"),
    ("hbm.timeout_s", 0, "hbm.timeout_s=0 is not allowed; allowed: a number > 0 and <= 86400"),
    ("job_time_limit_s", float("inf"), "job_time_limit_s=inf is not allowed"),
])
def test_a_value_of_the_wrong_type_or_out_of_range_is_refused(key, value, fragment):
    refused(with_(key, value), fragment)


def test_a_quoted_boolean_in_a_grid_is_refused():
    grid = {**CONFIG["microbench"]["cpu"]["groups"]["g"], "causal": "true"}
    refused(with_("microbench.cpu.groups", {"g": grid}), "causal")


def test_a_quoted_boolean_in_an_lr_variant_is_refused():
    refused(with_("pretrain.experiments.lr_sensitivity.variants", {"v": {"model": {"qk_norm": "yes"}}}),
            "pretrain.experiments.lr_sensitivity.variants.v.model.qk_norm='yes' is not allowed; allowed: true or false")


def test_a_quoted_number_in_a_layouts_entry_is_refused():
    refused(with_("pretrain.experiments.layouts.layouts", {"mha": {"d_model": "64"}}),
            "pretrain.experiments.layouts.layouts.mha.d_model='64' is not allowed; allowed: an integer")


def test_a_learning_rate_warm_up_longer_than_the_run_is_refused():
    refused(with_("pretrain.train", {"steps": 20, "warmup_steps": 50}),
            "train.warmup_steps=50 is longer than train.steps=20")


def test_a_context_warm_up_longer_than_its_pretraining_is_refused():
    refused(with_("context.capability.pretrain", {"steps": 20, "warmup_steps": 50}),
            "context.capability.pretrain.warmup_steps=50 is longer than pretrain.steps=20")


# ----------------------------------------------------------------------------------------------- late errors

def test_a_missing_training_data_file_is_found_when_planning(tmp_path):
    config = with_("stages", ["pretrain"], with_("pretrain.data", {"source": "file", "path": str(tmp_path / "no.txt")}))
    refused(config, "pretrain.data.path=", "is not a file")


def test_a_training_data_file_too_short_to_train_on_is_found_when_planning(tmp_path):
    (tmp_path / "tiny.txt").write_text("too short")
    config = with_("stages", ["context"], with_("context.capability.data", {"source": "file",
                                                                          "path": str(tmp_path / "tiny.txt")}))
    refused(config, "context.capability.data.path=", "has 9 bytes; allowed: a file of at least 1024 bytes")


def test_the_data_file_of_a_stage_the_sweep_does_not_run_is_not_looked_for(tmp_path):
    plan_of(with_("pretrain.data", {"source": "file", "path": str(tmp_path / "no.txt")}))  # stages: microbench


@pytest.mark.parametrize("key, value, fragment", [
    ("pretrain.experiments.lr_sensitivity.variants", {"v": {"model": {"qk_nrom": True}}}, "unknown key 'qk_nrom'"),
    ("pretrain.experiments.layouts.layouts", {"mha": {"d_modle": 64}}, "unknown key 'd_modle'"),
    ("context.capability.model", {"n_lyers": 2}, "context.capability.model: unknown key 'n_lyers'"),
    ("context.capability.model", {"rope": {}}, "context.capability.model"),
    ("context.capability.data", {"sorce": "file"}, "context.capability.data: unknown key 'sorce'"),
    ("context.capability.model", {"backend": "fa9"}, "context.capability.model.backend='fa9' is not known"),
    ("pretrain.cuda", {"model": {"foo": 1}}, "pretrain.cuda.model: unknown key 'foo'"),
    ("context.capability.cuda", {"eval": {"strid": 1}}, "context.capability.cuda.eval: unknown key 'strid'"),
])
def test_free_form_blocks_are_checked_when_planning_even_on_another_device(key, value, fragment):
    refused(with_(key, value), fragment)


@pytest.mark.parametrize("schema, words", [
    ({"type": "array", "minItems": 1}, "a list of at least one item"),
    ({"type": "array", "minItems": 10}, "a list of at least 10 items"),
    ({"type": "array", "maxItems": 4}, "a list of at most 4 items"),
    ({"type": "array", "minItems": 2, "maxItems": 100, "uniqueItems": True}, "a list of 2 to 100 distinct items"),
    ({"type": ["integer", "null"], "minimum": 1, "maximum": 50}, "an integer from 1 to 50, or null"),
    ({"type": "number", "minimum": 0, "exclusiveMaximum": 1}, "a number >= 0 and < 1"),
])
def test_a_schema_bound_is_named_in_words(schema, words):
    assert configs._allowed(schema) == words
