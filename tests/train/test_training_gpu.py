"""Training on a CUDA device: the divergence arms with the GPU's kernels, a run's sharing record, and FP8 with
Smooth-SwiGLU compiled (skipped without CUDA; ``pytest -m gpu tests/train``)."""
import math

import pytest
import torch

from attnbench import plan as planner
from attnbench.config import validate_config
from attnbench.train import experiments as ex
from attnbench.train.data import DataConfig, SyntheticConfig
from attnbench.train.loop import RunSpec, TrainConfig, train
from attnbench.models.gpt import GPTConfig

pytestmark = pytest.mark.gpu
GRID = {"backends": ["sdpa-math"], "groups": {"g": {"mode": "fwd", "batch": 1, "heads_q": 2, "head_dim": 64,
                                                    "seq": 128, "dtype": "bf16"}}}
SYNTH = DataConfig(source="synthetic", synthetic=SyntheticConfig(tokens=50_000))


def test_divergence_arms_on_the_gpu_kernels(tmp_path):
    kernels = ["sdpa-flash", "sdpa-cudnn", "flex", "fa4", "triton"]
    config = validate_config({
        "device": "cuda", "stages": ["pretrain"], "microbench": {"cpu": GRID, "cuda": dict(GRID)},
        "pretrain": {"data": {"source": "synthetic", "synthetic": {"tokens": 50000}},
                     "cuda": {"model": {"d_model": 128, "n_layers": 2, "n_heads": 2, "max_seq_len": 128},
                              "train": {"steps": 20, "batch_size": 8, "seq_len": 128, "eval_every": 10},
                              "experiments": {"divergence": {"references": ["sdpa-math", "eager"], "kernels": kernels,
                                                             "precision": "fp16", "swap_precisions": ["fp32", "bf16"],
                                                             "seeds": [0, 1], "snapshots": 2}},
                              "select": {"experiments": ["divergence"]}}}})
    job = planner.build_plan(config).job("pretrain", "divergence").payload
    frames = ex.run_experiment(job, tmp_path, progress=False)
    runs = frames["runs"].set_index("run")
    for backend in ["sdpa-math", "eager", "sdpa-flash", "sdpa-cudnn"]:
        assert runs.loc[f"divergence/{backend}/s0", "status"] == "ok", runs.loc[f"divergence/{backend}/s0", "reason"]
    assert set(runs["status"]) <= {"ok", "unavailable", "unsupported"}  # fa4, triton: rows with the reason if absent
    ok = runs[runs["status"] == "ok"]
    assert (ok["gpu_sharing"].isin(["alone", "shared"])).all() and (ok["mfu"] > 0).all()
    summary = ex.divergence_summary(frames["divergence"], ex.loss_divergence_frame(frames["runs"], frames["steps"]))
    floor = summary.set_index("label").loc["sdpa-math replicate"]
    assert floor["seeds_ok"] == 2 and math.isfinite(floor["rel_l2_mean"])  # 0 if this GPU's kernels are deterministic
    num = frames["numerics"]
    assert set(num.loc[num["backend"].isin(["sdpa-math", "eager", "sdpa-flash"]), "status"]) == {"ok"}


def test_fp8_tensorwise_with_smooth_swiglu_compiles_and_trains(tmp_path):
    pytest.importorskip("torchao")
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("torchao's FP8 matmuls need CUDA capability >= 8.9")
    model = GPTConfig(d_model=128, n_layers=2, n_heads=2, max_seq_len=128, backend="sdpa-flash", mlp="swiglu",
                      smooth_swiglu=True)
    tcfg = TrainConfig(steps=30, batch_size=8, seq_len=128, precision="fp8-tensorwise", compile=True, eval_every=15,
                       fp8_stats=("tensorwise",), fp8_stats_every=10)
    summary = train(RunSpec("smooth", model, tcfg, SYNTH), tmp_path, "cuda")
    assert summary["status"] == "ok" and not summary["emulated"], summary["reason"]
    assert summary["final_val_loss"] < summary["initial_val_loss"]
