"""The pretraining experiments: plans (arms, seeds, variants), training in parts, result frames with intervals,
tables and figures, and the CLI."""
import copy
import dataclasses
import json
import math
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from attnbench.cli import main
from attnbench import plan as planner
from attnbench.bench.ceilings import Ceilings
from attnbench.config import validate_config
from attnbench.errors import ConfigError
from attnbench.models.gpt import count_params
from attnbench.train import experiments as ex

PEAKS = {d: (1e9, "a test ceiling") for d in ("fp32", "bf16", "fp16", "fp8")}
TINY_MODEL = {"d_model": 16, "n_layers": 1, "n_heads": 2, "max_seq_len": 16}


def _tiny_config(**experiments) -> dict:
    grid = {"backends": ["sdpa-math"], "groups": {"g": {"mode": "fwd", "batch": 1, "heads_q": 2, "head_dim": 16,
                                                      "seq": 32, "dtype": "fp32"}}}
    exps = {"divergence": {"references": ["sdpa-math", "eager"], "kernels": ["sdpa-flash", "sdpa-cudnn"],
                           "swap_precisions": ["bf16"], "seeds": [0, 1], "snapshots": 2},
            "lr_sensitivity": {"lrs": [0.01, 0.1], "seeds": [0, 1]},
            "fp8": {"precisions": ["bf16", "fp8-tensorwise"], "seeds": [0, 1], "swiglu_precisions": ["bf16"]},
            "layouts": {"backend": "sdpa-math",
                        "layouts": {"mha": {}, "mqa": {}, "mla": {"kv_lora_rank": 8, "qk_nope_head_dim": 8,
                                                                   "qk_rope_head_dim": 4, "v_head_dim": 8}}}}
    exps.update(experiments)
    return validate_config({
        "device": "cpu", "stages": ["pretrain"], "microbench": {"cpu": grid, "cuda": copy.deepcopy(grid)},
        "pretrain": {"data": {"source": "synthetic", "synthetic": {"tokens": 20000}}, "model": TINY_MODEL,
                     "train": {"steps": 8, "batch_size": 4, "seq_len": 16, "eval_every": 4, "eval_batches": 1,
                               "probe_every": 4}, "experiments": exps}})


def _view(config) -> dict:
    return planner.device_view(config, "cpu")["pretrain"]


def _job(config, experiment: str) -> dict:
    return planner.build_plan(config).job("pretrain", experiment).payload


def test_divergence_plan_has_every_arm_at_every_seed_and_changes_one_thing_per_run():
    specs = {s.name: s for s in ex.plan_runs(_view(_tiny_config()), "divergence")}
    assert list(specs)[:9] == [f"divergence/{v}/s0" for v in (
        "sdpa-math", "eager", "sdpa-flash", "sdpa-cudnn", "sdpa-math-replicate", "eager-replicate", "sdpa-math-bf16",
        "sdpa-math-init", "sdpa-math-data")]
    assert len(specs) == 18  # seed-major: all of seed 0, then seed 1
    for seed in (0, 1):
        ref = specs[f"divergence/sdpa-math/s{seed}"]
        assert (ref.train.init_seed, ref.train.data_seed, ref.train.compile) == (seed, seed, False)
        assert ref.train.snapshot_steps == (0, 4, 8)
        expected = {"eager": {"backend"}, "sdpa-flash": {"backend"}, "sdpa-math-replicate": set(),
                    "sdpa-math-bf16": {"precision"}, "sdpa-math-init": {"init_seed"}, "sdpa-math-data": {"data_seed"}}
        for variant, diffs in expected.items():
            spec = specs[f"divergence/{variant}/s{seed}"]
            changed = {k for k, v in spec.model.to_dict().items() if ref.model.to_dict()[k] != v}
            changed |= {k for k, v in dataclasses.asdict(spec.train).items() if dataclasses.asdict(ref.train)[k] != v}
            assert changed == diffs, variant
        assert specs[f"divergence/sdpa-math-init/s{seed}"].train.init_seed == seed + 1000
    pairs = ex.divergence_pairs(ex._spec_rows(list(specs.values())))
    labels = {(p["arm"], p["label"]) for p in pairs}
    assert labels == {("kernel", "eager vs sdpa-math"), ("kernel", "sdpa-flash vs sdpa-math"),
                      ("kernel", "sdpa-flash vs eager"), ("kernel", "sdpa-cudnn vs sdpa-math"),
                      ("kernel", "sdpa-cudnn vs eager"), ("replicate", "sdpa-math replicate"),
                      ("replicate", "eager replicate"), ("precision", "bf16 vs fp32 (sdpa-math)"),
                      ("init_seed", "init seed swap (sdpa-math)"), ("data_order", "data order swap (sdpa-math)")}
    assert len(pairs) == 2 * len(labels) and all(p["reference_run"].endswith(f"/s{p['seed']}") for p in pairs)


def test_lr_and_fp8_plans_run_every_variant_at_their_seeds():
    view = _view(_tiny_config())
    lr = [s.name for s in ex.plan_runs(view, "lr_sensitivity")]
    assert lr[:4] == ["lr_sensitivity/baseline/lr0.01/s0", "lr_sensitivity/baseline/lr0.1/s0",
                      "lr_sensitivity/qk_norm-z_loss/lr0.01/s0", "lr_sensitivity/qk_norm-z_loss/lr0.1/s0"]
    assert len(lr) == 8
    fp8_config = _tiny_config(fp8={"precisions": ["bf16", "fp8-tensorwise"], "seeds": [0, 1],
                                   "swiglu_precisions": ["bf16", "fp8-tensorwise"]})
    fp8 = {s.name: s for s in ex.plan_runs(_view(fp8_config), "fp8")}
    # Smooth-SwiGLU at the FP8 precision only: at bf16 it is SwiGLU bit for bit (tests/models/test_gpt.py)
    assert list(fp8) == ["fp8/bf16/s0", "fp8/bf16/s1", "fp8/fp8-tensorwise/s0", "fp8/swiglu-bf16/s0",
                         "fp8/swiglu-fp8-tensorwise/s0", "fp8/smooth-swiglu-fp8-tensorwise/s0"]
    smooth = fp8["fp8/smooth-swiglu-fp8-tensorwise/s0"]
    assert (smooth.model.mlp, smooth.model.smooth_swiglu, smooth.train.precision) == ("swiglu", True, "fp8-tensorwise")
    assert fp8["fp8/swiglu-bf16/s0"].model.smooth_swiglu is False


def test_fp8_replicates_run_every_recipe_at_the_first_seeds_and_pair_within_a_seed():
    config = _tiny_config(fp8={"precisions": ["bf16", "fp8-tensorwise"], "seeds": [0, 1, 2], "replicates": 2,
                               "swiglu_precisions": ["bf16", "fp8-tensorwise"]})
    specs = ex.plan_runs(_view(config), "fp8")
    names = [s.name for s in specs]
    assert names == ["fp8/bf16/s0", "fp8/bf16/s1", "fp8/bf16/s2", "fp8/fp8-tensorwise/s0", "fp8/fp8-tensorwise/s1",
                     "fp8/swiglu-bf16/s0", "fp8/swiglu-bf16/s1", "fp8/swiglu-fp8-tensorwise/s0",
                     "fp8/swiglu-fp8-tensorwise/s1", "fp8/smooth-swiglu-fp8-tensorwise/s0",
                     "fp8/smooth-swiglu-fp8-tensorwise/s1"]
    runs = pd.DataFrame([{"run": s.name, "status": "ok", "precision": s.train.precision,
                          "mlp_variant": s.tags["mlp_variant"], "seed": s.tags["seed"]} for s in specs])
    pairs, seeds = ex._fp8_pairs(runs)
    assert pairs["fp8/swiglu-fp8-tensorwise/s1"] == "fp8/swiglu-bf16/s1"
    assert pairs["fp8/smooth-swiglu-fp8-tensorwise/s1"] == "fp8/swiglu-bf16/s1"
    assert pairs["fp8/fp8-tensorwise/s1"] == "fp8/bf16/s1" and seeds == ["fp8/bf16/s0", "fp8/bf16/s1", "fp8/bf16/s2"]
    config["pretrain"]["experiments"]["fp8"]["replicates"] = 4
    with pytest.raises(ConfigError, match=r"pretrain.experiments.fp8.replicates=4 is more than the 3 seeds; "
                                          r"allowed: 1 to 3"):
        ex.plan_runs(_view(config), "fp8")


def test_layouts_plan_matches_parameters():
    specs = ex.plan_runs(_view(_tiny_config()), "layouts")
    counts = [count_params(s.model) for s in specs]
    assert [s.model.layout for s in specs] == ["mha", "mqa", "mla"]
    assert max(counts) - min(counts) <= TINY_MODEL["d_model"] * TINY_MODEL["n_layers"]


def test_select_runs_takes_names_and_patterns_and_rejects_what_matches_nothing():
    config = _tiny_config()
    config["pretrain"]["select"] = {"experiments": ["divergence"], "runs": ["divergence/*/s1"]}
    job = _job(config, "divergence")
    assert len(job["runs"]) == 18 and len(job["train"]) == 9 and all(n.endswith("/s1") for n in job["train"])
    config["pretrain"]["select"]["runs"] = ["divergence/nope/*"]
    with pytest.raises(ConfigError, match=r"pretrain.select.runs: 'divergence/nope/\*' is not a planned run"):
        planner.build_plan(config)


def test_select_runs_may_name_a_run_only_the_gpu_plans():
    """A CPU host plans the cuda blocks too; a run only they plan (here fp8-tensorwise at seed 1, from the cuda
    block's replicates) is a valid choice: the GPU trains it, the CPU plan selects nothing."""
    config = _tiny_config()
    config["pretrain"]["select"] = {"experiments": ["fp8"], "runs": ["fp8/fp8-tensorwise/s1"]}
    config["pretrain"]["cuda"] = {"experiments": {"fp8": {"replicates": 2}}}
    plans = planner.check_config(validate_config(config))
    assert plans["cuda"].job("pretrain", "fp8").payload["train"] == ["fp8/fp8-tensorwise/s1"]
    assert plans["cpu"].job("pretrain", "fp8").payload["train"] == []


def test_divergence_in_two_parts_with_intervals_tables_and_figures(tmp_path):
    config = _tiny_config()
    config["pretrain"]["select"] = {"experiments": ["divergence"], "runs": ["divergence/*/s0"]}
    first = ex.run_experiment(_job(config, "divergence"), tmp_path / "exp", progress=False, peak_cache=dict(PEAKS))
    runs = first["runs"].set_index("run")
    assert (runs.loc[runs.index.str.endswith("/s1"), "status"] == "skipped").all()
    assert "not selected" in runs.loc["divergence/sdpa-math/s1", "reason"]
    assert runs.loc["divergence/sdpa-cudnn/s0", "status"] == "unavailable"  # no CUDA here: a row with the reason
    config["pretrain"]["select"]["runs"] = ["divergence/*/s1"]  # the second part: seed 1; seed 0 is read back
    frames = ex.run_experiment(_job(config, "divergence"), tmp_path / "exp", progress=False, peak_cache=dict(PEAKS))
    runs = frames["runs"].set_index("run")
    assert set(runs["status"]) == {"ok", "unavailable"} and len(runs) == 18
    div = frames["divergence"]
    assert set(div["seed"]) == {0, 1} and set(div["step"]) == {0, 4, 8}
    at0 = div[div["step"] == 0]
    assert (at0[at0["arm"] != "init_seed"][["max_abs", "rel_l2", "w1_mean"]] == 0).all().all()  # same initial weights
    assert (at0[at0["arm"] == "init_seed"]["rel_l2"] > 0.1).all()  # (the LayerNorm gains, all 1, are shared)
    replicate = div[div["arm"] == "replicate"]
    assert (replicate[["max_abs", "rel_l2", "w1_mean", "w1_max"]] == 0).all().all()  # CPU runs are deterministic
    assert (div[(div["arm"] == "data_order") & (div["step"] == 8)]["rel_l2"] > 0).all()

    loss = ex.loss_divergence_frame(frames["runs"], frames["steps"])
    summary = ex.divergence_summary(div, loss).set_index("label")
    rep = summary.loc["sdpa-math replicate"]
    assert rep["identical"] and rep["rel_l2_mean"] == 0 and rep["seeds_ok"] == 2 and rep["val_loss_gap_mean"] == 0
    cudnn = summary.loc["sdpa-cudnn vs sdpa-math"]
    assert cudnn["status"] == "unavailable" and cudnn["seeds_ok"] == 0 and "sdpa-cudnn" in cudnn["reason"]
    init = summary.loc["init seed swap (sdpa-math)"]
    assert init["rel_l2_n"] == 2 and init["rel_l2_ci_low"] < init["rel_l2_mean"] < init["rel_l2_ci_high"]
    assert math.isinf(init["over_replicate"])  # any divergence is infinitely above a zero floor
    num = frames["numerics"]
    assert set(num.loc[num["backend"] != "sdpa-cudnn", "status"]) == {"ok"}
    assert (num.loc[num["backend"] == "sdpa-cudnn", "status"] == "unavailable").all()
    joined = ex.kernel_training_frame(ex.divergence_summary(div, loss), num, "fp32").set_index(["backend", "reference"])
    assert joined.loc[("sdpa-flash", "sdpa-math"), "out_rel_err"] > 0
    assert joined.loc[("sdpa-flash", "sdpa-math"), "replicate_rel_l2"] == 0

    names = _rendered("divergence", tmp_path / "exp", tmp_path / "report")
    assert {"divergence.md", "divergence.tex", "divergence.csv", "divergence_pairs.md", "divergence_numerics.md",
            "divergence_kernels.md", "divergence_spikes.md", "divergence.png"} <= names
    text = (tmp_path / "report" / "tables" / "divergence.md").read_text()
    assert "Golden et al. 2024" in text and "Student-t" in text and "sdpa-math replicate" in text


def test_lr_sensitivity_is_per_seed_over_the_whole_grid_with_diverged_runs_included():
    rows = []
    for seed, finals in ((0, [3.0, math.nan, 4.0]), (1, [3.2, 5.0, 4.4])):
        for lr, final in zip((1e-3, 1e-2, 1e-1), finals):
            rows.append({"run": f"lr/b/lr{lr}/s{seed}", "variant": "b", "seed": seed, "lr": lr,
                         "status": "diverged" if math.isnan(final) else "ok", "final_val_loss": final,
                         "initial_val_loss": 5.5, "max_attention_logit": 10.0})
    rows.append({"run": "lr/q/lr0.1/s0", "variant": "q", "seed": 0, "lr": 0.1, "status": "truncated",
                 "final_val_loss": 3.1, "initial_val_loss": 5.5, "max_attention_logit": 2.0})
    rows.append({"run": "lr/q/lr0.1/s1", "variant": "q", "seed": 1, "lr": 0.1, "status": "error",
                 "final_val_loss": math.nan, "initial_val_loss": math.nan, "max_attention_logit": math.nan})
    grid, sens = ex.lr_frame(pd.DataFrame(rows))
    b = sens.set_index("variant").loc["b"]
    per_seed = [(3.0 + 5.5 + 4.0) / 3 - 3.0, (3.2 + 5.0 + 4.4) / 3 - 3.2]
    assert b["lr_sensitivity_mean"] == pytest.approx(sum(per_seed) / 2) and b["lr_sensitivity_n"] == 2
    assert b["diverged_runs"] == 1 and b["lrs"] == 3
    q = sens.set_index("variant").loc["q"]
    assert q["lr_sensitivity_n"] == 1 and q["incomplete_seeds"] == "1" and q["truncated_runs"] == 1
    assert grid.loc["b", 1e-3] == pytest.approx(3.1)


def test_fp8_gap_opens_where_it_leaves_the_baseline_seeds_band_for_good():
    steps = [10, 20, 30, 40]
    val = {"fp8/bf16/s0": [3.0, 2.5, 2.2, 2.0], "fp8/bf16/s1": [3.1, 2.6, 2.3, 2.1],
           "fp8/tw/s0": [3.04, 2.7, 2.5, 2.4], "fp8/swiglu-bf16/s0": [3.0, 2.4, 2.1, 1.9],
           "fp8/smooth-swiglu-tw/s0": [3.0, 2.4, 2.1, 1.9]}
    runs = pd.DataFrame([{"run": r, "variant": r.split("/")[1], "seed": 0, "status": "ok",
                          "precision": "bf16" if "bf16" in r else "fp8-tensorwise",
                          "mlp_variant": "swiglu" if "swiglu-bf16" in r else "smooth-swiglu" if "smooth" in r else
                          "gelu", "final_val_loss": v[-1]} for r, v in val.items()])
    step_rows = pd.DataFrame([{"run": r, "step": s, "val_loss": x} for r, v in val.items() for s, x in zip(steps, v)])
    runs.loc[runs["run"] == "fp8/bf16/s1", "seed"] = 1
    gaps = ex.fp8_gap_frame(runs, step_rows)
    tw = gaps[gaps["run"] == "fp8/tw/s0"].set_index("step")
    # paired with bf16 at its own seed; the band is +- how far a bf16 seed lies from the seeds' mean (0.05)
    assert tw.loc[10, "gap"] == pytest.approx(0.04) and tw.loc[10, "band_high"] == pytest.approx(0.05)
    assert tw.loc[10, "band_low"] == pytest.approx(-0.05)
    assert ex.gap_opens(gaps[gaps["run"] == "fp8/tw/s0"]) == 20  # inside the band at 10, outside from 20 on
    assert (gaps[gaps["run"].str.startswith("fp8/bf16")]["gap"] == 0).all()  # a baseline seed is its own pair
    smooth = gaps[gaps["run"] == "fp8/smooth-swiglu-tw/s0"]
    assert (smooth["gap"] == 0).all()  # paired with the SwiGLU run: Smooth-SwiGLU has no bf16 run of its own here
    table = ex.fp8_frame(runs, step_rows).set_index("variant")
    assert table.loc["tw", "gap_opens_at_step"] == 20 and table.loc["tw", "gap"] == pytest.approx(0.4)
    assert math.isnan(table.loc["bf16", "gap_opens_at_step"].iloc[0])
    assert math.isnan(table.loc["tw", "train_gap_opens_at_step"])  # no training loss logged: no training-loss gap
    from attnbench.report.pretrain import fp8_outputs

    _, figures = fp8_outputs(runs, step_rows, pd.DataFrame())  # the gap figure draws its empty training panel
    assert [len(f.axes) for f in figures] == [2, 1]


def test_fp8_training_loss_gap_pairs_the_same_steps_and_the_best_val_loss_marks_memorisation():
    losses = {"fp8/bf16/s0": [2.0, 1.0, 0.8, 0.6], "fp8/bf16/s1": [2.2, 1.2, 1.0, 0.8], "fp8/tw/s0": [2.0, 1.1, 1.0]}
    val = {"fp8/bf16/s0": [2.1, 1.5, 1.7, 2.0], "fp8/bf16/s1": [2.3, 1.6, 1.8, 2.1], "fp8/tw/s0": [2.1, 1.4, 1.6]}
    runs = pd.DataFrame([{"run": r, "variant": r.split("/")[1], "seed": int(r[-1]),
                          "status": "ok" if len(v) == 4 else "truncated",
                          "precision": "bf16" if "bf16" in r else "fp8-tensorwise", "mlp_variant": "gelu",
                          "final_val_loss": val[r][-1]} for r, v in losses.items()])
    step_rows = pd.DataFrame([{"run": r, "step": i, "loss": x, "val_loss": val[r][i]}
                              for r, v in losses.items() for i, x in enumerate(v)])
    train = ex.fp8_train_gap_frame(runs, step_rows, window=2).set_index("run")
    # the truncated run ends at step 2: its window is steps 1-2, and its pair's mean is taken over the same steps
    assert train.loc["fp8/tw/s0", "train_loss"] == pytest.approx(1.05)
    assert train.loc["fp8/tw/s0", "train_gap"] == pytest.approx(1.05 - 0.9)
    assert train.loc["fp8/tw/s0", "train_band_high"] == pytest.approx(0.1)  # seeds' means 0.9 and 1.1 over steps 1-2
    assert train.loc["fp8/bf16/s0", "train_loss"] == pytest.approx(0.7)  # a finished run: its own last two steps
    table = ex.fp8_frame(runs, step_rows).set_index("variant")
    assert table.loc["tw", "best_val_step"] == 1 and table.loc["tw", "best_val_loss"] == pytest.approx(1.4)
    assert (table.loc["bf16", "best_val_step"] == 1).all()  # val loss rises after step 1 though training loss falls


def test_fp8_training_loss_gap_over_windows_says_when_it_leaves_the_seeds_band():
    # 7 steps in windows of 2 counted back from the last: steps (0), (1, 2), (3, 4), (5, 6)
    losses = {"fp8/bf16/s0": [2.0, 1.5, 1.3, 1.0, 0.9, 0.8, 0.7], "fp8/bf16/s1": [2.0, 1.7, 1.5, 1.2, 1.1, 1.0, 0.9],
              "fp8/tw/s0": [2.0, 1.5, 1.4, 1.3, 1.2, 1.2, 1.1]}
    runs = pd.DataFrame([{"run": r, "variant": r.split("/")[1], "seed": int(r[-1]), "status": "ok",
                          "precision": "bf16" if "bf16" in r else "fp8-tensorwise", "mlp_variant": "gelu"}
                         for r in losses])
    step_rows = pd.DataFrame([{"run": r, "step": i, "loss": x} for r, v in losses.items() for i, x in enumerate(v)])
    curve = ex.fp8_train_gap_curve(runs, step_rows, window=2)
    tw = curve[curve["run"] == "fp8/tw/s0"].set_index("step")
    assert list(tw.index) == [0, 2, 4, 6]  # each window is named by its last step
    assert tw.loc[2, "gap"] == pytest.approx(1.45 - 1.4) and tw.loc[2, "band_high"] == pytest.approx(0.1)
    assert tw.loc[4, "gap"] == pytest.approx(1.25 - 0.95) and tw.loc[6, "gap"] == pytest.approx(1.15 - 0.75)
    assert ex.gap_opens(tw.reset_index()) == 4  # inside the band (+-0.1) up to the window ending at 2
    last = ex.fp8_train_gap_frame(runs, step_rows, window=2).set_index("run").loc["fp8/tw/s0"]
    assert last["train_gap"] == tw.loc[6, "gap"] and last["train_band_high"] == tw.loc[6, "band_high"]


def test_fp8_gaps_over_seeds_leave_out_the_baseline_and_runs_that_did_not_finish():
    from attnbench.train.intervals import t_interval

    def row(variant, precision, seed, gap, opens, status="ok"):
        return {"variant": variant, "precision": precision, "mlp": "gelu", "seed": seed, "status": status,
                "gap": gap, "band_high": 0.1, "train_gap": gap / 2, "train_band_high": 0.2, "gap_opens_at_step": opens}

    frame = pd.DataFrame([row("bf16", "bf16", s, 0.0, math.nan) for s in (0, 1, 2)]
                         + [row("tw", "fp8-tensorwise", 0, 0.3, 400), row("tw", "fp8-tensorwise", 1, 0.5, 200),
                            row("tw", "fp8-tensorwise", 2, 0.4, math.nan), row("mx", "mxfp8", 0, 0.2, 600),
                            row("mx", "mxfp8", 1, math.nan, math.nan, status="error")])
    seeds = ex.fp8_seeds_frame(frame).set_index("variant")
    assert list(seeds.index) == ["tw", "mx"]
    tw, mx = seeds.loc["tw"], seeds.loc["mx"]
    ci = t_interval([0.3, 0.5, 0.4])
    assert tw["seeds"] == "0,1,2" and tw["gap_n"] == 3 and tw["gap_mean"] == pytest.approx(0.4)
    assert (tw["gap_ci_low"], tw["gap_ci_high"]) == pytest.approx((ci.low, ci.high))
    assert tw["train_gap_mean"] == pytest.approx(0.2) and tw["band_high"] == 0.1 and tw["train_band_high"] == 0.2
    assert (tw["opened"], tw["opens_first"], tw["opens_last"]) == (2, 200, 400)  # seed 2's gap never opened
    assert mx["seeds"] == "0" and mx["gap_n"] == 1 and math.isnan(mx["gap_ci_low"]) and mx["opened"] == 1
    assert ex.fp8_seeds_frame(frame.iloc[:0]).empty


def test_fp8_contrasts_pair_variants_of_one_mlp_by_seed():
    from attnbench.train.intervals import t_interval

    def row(variant, precision, mlp, seed, loss, status="ok"):
        return {"variant": variant, "precision": precision, "mlp": mlp, "seed": seed, "status": status,
                "final_val_loss": loss, "train_loss": loss + 0.5}

    frame = pd.DataFrame([row("bf16", "bf16", "gelu", s, 1.0) for s in (0, 1, 2)]
                         + [row("tw", "fp8-tensorwise", "gelu", s, x) for s, x in ((0, 1.3), (1, 1.5), (2, 1.4))]
                         + [row("mx", "mxfp8", "gelu", s, x) for s, x in ((0, 1.1), (1, 1.4))]
                         + [row("mx", "mxfp8", "gelu", 2, math.nan, status="error")]
                         + [row("sw", "fp8-tensorwise", "swiglu", s, 2.0 + s) for s in (0, 1)]
                         + [row("smooth", "fp8-tensorwise", "smooth-swiglu", s, 1.9 + s) for s in (0, 1)])
    contrasts = ex.fp8_contrasts_frame(frame).set_index(["variant", "against"])
    assert list(contrasts.index) == [("mx", "tw"), ("smooth", "sw")]  # no baseline, no pair across MLPs
    mx = contrasts.loc[("mx", "tw")]
    ci = t_interval([1.1 - 1.3, 1.4 - 1.5])  # seed 2's MXFP8 run did not finish: its pair is left out
    assert mx["seeds"] == "0,1" and mx["diff_n"] == 2 and mx["mlp"] == "gelu"
    assert (mx["diff_mean"], mx["diff_ci_low"], mx["diff_ci_high"]) == pytest.approx((ci.mean, ci.low, ci.high))
    assert mx["train_diff_mean"] == pytest.approx(ci.mean)
    smooth = contrasts.loc[("smooth", "sw")]
    assert smooth["mlp"] == "swiglu" and smooth["diff_mean"] == pytest.approx(-0.1) and smooth["diff_n"] == 2
    assert ex.fp8_contrasts_frame(frame.iloc[:0]).empty


def test_fp8_experiment_logs_per_layer_statistics_and_renders(tmp_path):
    pytest.importorskip("torchao")
    config = _tiny_config(fp8={"precisions": ["bf16", "fp8-tensorwise"], "seeds": [0], "swiglu_precisions": [],
                               "stats": ["tensorwise"]})
    frames = ex.run_experiment(_job(config, "fp8"), tmp_path / "exp", progress=False, peak_cache=dict(PEAKS))
    assert set(frames["runs"]["status"]) == {"ok"}
    layers = frames["fp8_layers"]
    assert set(layers["run"]) == {"fp8/bf16/s0", "fp8/fp8-tensorwise/s0"} and set(layers["recipe"]) == {"tensorwise"}
    names = _rendered("fp8", tmp_path / "exp", tmp_path / "report")
    assert {"fp8.md", "fp8_seeds.md", "fp8_contrasts.md", "fp8_scales.md", "fp8_layers.md", "fp8_spikes.md", "fp8.png",
            "fp8_layers.png"} <= names
    assert "blocks.0.mlp.proj" in (tmp_path / "report" / "tables" / "fp8_layers.md").read_text()
    floor = frames["runs"]["loss_floor"].iloc[0]  # the synthetic chain's: the caption says how close a run came
    assert 0 < floor and f"loss floor {floor:.4f}" in (tmp_path / "report" / "tables" / "fp8.md").read_text()


def test_ceilings_of_another_device_give_no_mfu():
    ceilings = Ceilings("cuda", "NVIDIA H200", 4e12, {"bf16": 7e14}, "2026-01-01")
    same = ex.ceiling_cache(ceilings, "NVIDIA H200", "results/s/ceilings.json")
    assert same["bf16"][0] == 7e14 and "ceilings job (results/s/ceilings.json; NVIDIA H200" in same["bf16"][1]
    other = ex.ceiling_cache(ceilings, "NVIDIA H100", "c.json")
    assert math.isnan(other["bf16"][0]) and "measured on NVIDIA H200, this run is on NVIDIA H100" in other["bf16"][1]


def test_cli_train_and_experiment_list(tmp_path, capsys):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(_tiny_config(), sort_keys=False))  # layout order matters
    assert main(["experiment", "list", "--config", str(path)]) == 0
    listed = capsys.readouterr().out.split()
    assert [n for n in listed if n.startswith("lr_sensitivity/") and n.endswith("/s0")] == [
        "lr_sensitivity/baseline/lr0.01/s0", "lr_sensitivity/baseline/lr0.1/s0",
        "lr_sensitivity/qk_norm-z_loss/lr0.01/s0", "lr_sensitivity/qk_norm-z_loss/lr0.1/s0"]
    assert main(["train", "--config", str(path), "--run", "layouts/mqa", "--out", str(tmp_path / "run"),
                 "--no-progress"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["run"] == "layouts/mqa" and out["status"] == "ok" and out["gpu_sharing"] == "unchecked: a cpu run"
    assert main(["train", "--config", str(path), "--run", "layouts/gqa", "--out", str(tmp_path / "x")]) == 2
    assert "allowed: layouts/mha, layouts/mqa, layouts/mla" in capsys.readouterr().err


def _rendered(experiment: str, exp_dir, out) -> set[str]:
    """The file names the pretrain stage writes for one experiment (report.pretrain.build, artifacts.write_stage)."""
    from attnbench.report.artifacts import write_stage
    from attnbench.report.pretrain import build

    index = write_stage("pretrain", build({experiment: exp_dir}), out)
    return {Path(f).name for entry in index["tables"] + index["figures"] for f in entry["files"].values()}


def test_divergence_continued_on_another_machine_keeps_its_rows_and_retrains_only_runs_a_pair_needs(tmp_path,
                                                                                                      monkeypatch):
    config = _tiny_config(divergence={"references": ["sdpa-math"], "kernels": ["sdpa-flash"], "swap_precisions": [],
                                      "seeds": [0, 1], "snapshots": 2})
    config["pretrain"]["select"] = {"experiments": ["divergence"], "runs": ["divergence/*/s0"]}
    out = tmp_path / "exp"
    trained = []
    real_train = ex.train
    monkeypatch.setattr(ex, "train", lambda spec, *a, **kw: trained.append((spec.name, kw["again"])) or
                        real_train(spec, *a, **kw))

    def run():
        trained.clear()
        return ex.run_experiment(_job(config, "divergence"), out, progress=False, peak_cache=dict(PEAKS))

    def lose_snapshots():  # what a lease's pack leaves behind: everything but *.pt
        for path in out.rglob("*.pt"):
            path.unlink()

    def written():  # when each trained run last wrote its step log
        return {p.parent.relative_to(out).as_posix(): p.stat().st_mtime_ns for p in out.rglob("steps.parquet")
                if p.parent != out}

    first = run()["divergence"]
    assert set(first["seed"]) == {0} and first["config_hash"].notna().all()
    before = written()
    lose_snapshots()
    config["pretrain"]["select"]["runs"] = ["divergence/*"]  # seed 1 on a machine without seed 0's snapshots
    frames = run()
    assert not any(flag for _, flag in trained)
    assert {k: v for k, v in written().items() if k in before} == before  # seed 0 was not trained again
    div = frames["divergence"]
    cols = ["arm", "variant", "seed", "step", "max_abs", "rel_l2", "w1_mean"]
    pd.testing.assert_frame_equal(div[div["seed"] == 0][cols].reset_index(drop=True), first[cols])  # kept, not lost
    assert set(div["seed"]) == {0, 1} and len(div) == 2 * len(first)

    lose_snapshots()
    (out / "divergence.parquet").unlink()  # no rows and no snapshots: the finished runs a pair needs train again
    before = written()
    again = run()
    retrained = {name for name, flag in trained if flag}
    ok = set(again["runs"].loc[again["runs"]["status"] == "ok", "run"])
    assert retrained == ok and all(written()[k] > before[k] for k in before)
    cols = ["arm", "variant", "seed", "step", "rel_l2"]
    pd.testing.assert_frame_equal(again["divergence"][cols].sort_values(cols[:4]).reset_index(drop=True),
                                  div[cols].sort_values(cols[:4]).reset_index(drop=True))  # CPU runs repeat exactly


def test_divergence_stopped_from_outside_keeps_its_numerics_and_the_pairs_it_finished(tmp_path, monkeypatch):
    config = _tiny_config(divergence={"references": ["sdpa-math"], "kernels": ["sdpa-flash"], "swap_precisions": [],
                                      "seeds": [0], "snapshots": 2})
    out = tmp_path / "exp"
    real_train, calls = ex.train, []

    def killed_at_the_third_run(spec, *a, **kw):
        calls.append(spec.name)
        if len(calls) == 3:
            raise KeyboardInterrupt  # the lease's timeout: not an error row, the end of the job
        return real_train(spec, *a, **kw)

    monkeypatch.setattr(ex, "train", killed_at_the_third_run)
    with pytest.raises(KeyboardInterrupt):
        ex.run_experiment(_job(config, "divergence"), out, progress=False, peak_cache=dict(PEAKS))
    assert not (out / "runs.parquet").exists()
    assert set(pd.read_parquet(out / "numerics.parquet")["backend"]) == {"sdpa-math", "sdpa-flash"}
    kept = pd.read_parquet(out / "divergence.parquet")
    assert set(kept["label"]) == {"sdpa-flash vs sdpa-math"} and set(kept["step"]) == {0, 4, 8}

    for path in out.rglob("*.pt"):  # continued on another machine
        path.unlink()
    calls.clear()
    monkeypatch.setattr(ex, "train", real_train)
    monkeypatch.setattr(ex, "numerics_frame", lambda *a: pytest.fail("numerics.parquet had every case it needs"))
    frames = ex.run_experiment(_job(config, "divergence"), out, progress=False, peak_cache=dict(PEAKS),
                               stop_at=time.time() + 3600)
    div = frames["divergence"]
    assert set(div["arm"]) == {"kernel", "replicate", "init_seed", "data_order"} and div["rel_l2"].notna().all()
    cols = ["variant", "step", "max_abs", "rel_l2"]
    pd.testing.assert_frame_equal(div[div["variant"] == "sdpa-flash"][cols].reset_index(drop=True), kept[cols])
    assert set(frames["numerics"]["backend"]) == {"sdpa-math", "sdpa-flash"}


def test_an_experiment_honours_the_sweep_deadline(tmp_path):
    config = _tiny_config()
    frames = ex.run_experiment(_job(config, "layouts"), tmp_path / "exp", progress=False, peak_cache=dict(PEAKS),
                               stop_at=time.time() - 1)
    runs = frames["runs"]
    assert (runs["status"] == "skipped").all() and runs["reason"].str.contains("sweep's deadline").all()


def test_divergence_runs_trained_concurrently_give_the_rows_of_runs_trained_one_by_one(tmp_path):
    arms = {"references": ["sdpa-math"], "kernels": ["sdpa-flash"], "swap_precisions": [], "seeds": [0],
            "snapshots": 2}
    frames = {}
    for workers in (1, 2):
        config = _tiny_config(divergence={**arms, "concurrent_runs": workers})
        job = _job(config, "divergence")
        assert job["concurrent_runs"] == workers
        frames[workers] = ex.run_experiment(job, tmp_path / f"w{workers}", progress=False, peak_cache=dict(PEAKS))
    one, two = frames[1], frames[2]
    assert list(two["runs"]["run"]) == list(one["runs"]["run"]) and set(two["runs"]["status"]) == {"ok"}
    cols = ["arm", "variant", "seed", "step", "max_abs", "rel_l2", "w1_mean"]
    pd.testing.assert_frame_equal(two["divergence"][cols], one["divergence"][cols], rtol=1e-5)
    assert (two["divergence"].loc[two["divergence"]["arm"] == "replicate", "rel_l2"] == 0).all()


def test_fp8_runs_trained_concurrently_give_the_losses_and_scale_statistics_of_runs_trained_one_by_one(tmp_path):
    frames = {}
    for workers in (1, 2):
        config = _tiny_config(fp8={"precisions": ["bf16"], "seeds": [0, 1], "swiglu_precisions": ["bf16"],
                                   "concurrent_runs": workers})
        job = _job(config, "fp8")
        assert job["concurrent_runs"] == workers
        frames[workers] = ex.run_experiment(job, tmp_path / f"w{workers}", progress=False, peak_cache=dict(PEAKS))
    one, two = frames[1], frames[2]
    assert list(two["runs"]["run"]) == list(one["runs"]["run"]) and set(two["runs"]["status"]) == {"ok"}
    assert list(two["runs"]["final_val_loss"]) == list(one["runs"]["final_val_loss"])
    keys = ["run", "step", "layer", "recipe", "kind"]
    layers = [f["fp8_layers"].sort_values(keys, ignore_index=True) for f in (one, two)]
    assert len(layers[0]) > 0
    pd.testing.assert_frame_equal(layers[1], layers[0])
