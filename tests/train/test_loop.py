"""Training runs: data pinning and order, separate init and data seeds, exact resume, non-finite steps, time budgets,
custom data sources and initial weights, precisions, FP8 statistics (summed and per layer)."""
import dataclasses
import hashlib
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

from attnbench.errors import ConfigError
from attnbench.data import CORPORA
from attnbench.models.gpt import GPT, GPTConfig
from attnbench.train.data import DataConfig, SyntheticConfig, check_source, load_tokens
from attnbench.train.loop import RunSpec, TrainConfig, lr_at, speed_stats, train
from attnbench.train.precision import (FORMATS, RECIPE_FORMATS, STATS_RECIPES, TENSOR_KINDS, Fp8Stats,
                                       Fp8StatsRecorder, MXFP8EmulatedLinear, fp8_tensor_stats, get_precision,
                                       mx_quantize)

TINY_MODEL = GPTConfig(d_model=16, n_layers=1, n_heads=2, max_seq_len=16)
TINY_TRAIN = TrainConfig(steps=12, batch_size=4, seq_len=16, lr=1e-2, warmup_steps=2, eval_every=6, eval_batches=1,
                         probe_every=3, ckpt_every=4)
SYNTH = DataConfig(source="synthetic", synthetic=SyntheticConfig(tokens=20_000))


def _spec(**train) -> RunSpec:
    return RunSpec("t", TINY_MODEL, dataclasses.replace(TINY_TRAIN, **train), SYNTH)


def test_shipped_corpus_is_pinned_and_documented():
    corpus = CORPORA["shakespeare"]
    data = corpus.read()
    assert hashlib.sha256(data).hexdigest() == corpus.sha256
    readme = (Path(__file__).parents[2] / "attnbench" / "data" / "README.md").read_text()
    assert corpus.sha256 in readme and "public domain" in readme.lower()
    assert 1e6 < len(data) < 2e7 and data.isascii()


def test_split_and_order_are_deterministic():
    tokens = load_tokens(DataConfig())
    assert tokens.sha256 == CORPORA["shakespeare"].sha256
    assert len(tokens.train) == int(0.9 * (len(tokens.train) + len(tokens.val)))
    x1, y1 = tokens.train_batch(7, seed=0, batch_size=4, seq_len=32, device="cpu")
    x2, _ = tokens.train_batch(7, seed=0, batch_size=4, seq_len=32, device="cpu")
    x3, _ = tokens.train_batch(7, seed=1, batch_size=4, seq_len=32, device="cpu")
    assert torch.equal(x1, x2) and not torch.equal(x1, x3)
    assert torch.equal(x1[:, 1:], y1[:, :-1])  # targets are the next bytes
    v1, v2 = tokens.val_batches(2, 4, 32, "cpu"), tokens.val_batches(2, 4, 32, "cpu")
    assert all(torch.equal(a[0], b[0]) for a, b in zip(v1, v2))


def test_file_source_and_synthetic_floor(tmp_path):
    path = tmp_path / "text.txt"
    path.write_bytes(b"hello world. " * 200)
    tokens = load_tokens(DataConfig(source="file", path=str(path)))
    assert tokens.sha256 == hashlib.sha256(path.read_bytes()).hexdigest() and tokens.name == "file:text.txt"
    synth = load_tokens(SYNTH)
    assert 0 < synth.loss_floor < math.log(3)  # at most log(branching) nats per token
    assert synth.sha256 == load_tokens(SYNTH).sha256  # seeded
    with pytest.raises(ConfigError, match="data.source='web'"):
        DataConfig(source="web")


def test_synthetic_stream_draws_every_batch_afresh_from_the_chain_with_a_known_floor(tmp_path):
    cfg = DataConfig(source="synthetic-stream", synthetic=SyntheticConfig(vocab=8, order=2, branching=3))
    stream = load_tokens(cfg)
    x1, y1 = stream.train_batch(7, seed=0, batch_size=4, seq_len=32, device="cpu")
    x2, _ = stream.train_batch(7, seed=0, batch_size=4, seq_len=32, device="cpu")
    assert torch.equal(x1, x2) and torch.equal(x1[:, 1:], y1[:, :-1])  # a pure function of (seed, step)
    others = [stream.train_batch(step, seed, 4, 32, "cpu")[0] for step, seed in ((8, 0), (7, 1))]
    assert not any(torch.equal(x1, x) for x in others)  # another step or data seed: other windows
    # every symbol is one of its context's successors, so the data is the chain's, and symbols are bytes 64 + i
    chain = torch.cat([x1, y1[:, -1:]], dim=1) - 64
    assert chain.min() >= 0 and chain.max() < 8
    successors = torch.from_numpy(stream.successors)
    for row in chain:
        for t in range(2, len(row)):
            assert row[t] in successors[row[t - 2] * 8 + row[t - 1]]
    val = stream.val_batches(2, 4, 32, "cpu")
    assert all(torch.equal(a[0], b[0]) for a, b in zip(val, stream.val_batches(2, 4, 32, "cpu")))
    assert 0 < stream.loss_floor < math.log(3)
    assert stream.sha256 == load_tokens(dataclasses.replace(cfg, val_fraction=0.5)).sha256  # the table, not a split
    assert stream.sha256 != load_tokens(dataclasses.replace(cfg, seed=1)).sha256
    with pytest.raises(ConfigError, match="vocab \\*\\* order <= 1048576"):  # the table's size, checked when planned
        check_source(dataclasses.replace(cfg, synthetic=SyntheticConfig(vocab=64, order=4)), "pretrain.data")
    # a run trains on it and records its floor
    spec = RunSpec("t", TINY_MODEL, TINY_TRAIN, cfg)
    summary = train(spec, tmp_path, "cpu", peak_flops=1e9, peak_flops_source="a test ceiling")
    assert summary["status"] == "ok" and summary["loss_floor"] == pytest.approx(stream.loss_floor)
    assert summary["corpus"] == stream.name and summary["corpus_sha256"] == stream.sha256


def _alias_distribution(keep, alias):
    """The distribution a Walker alias table gives when its column is picked uniformly."""
    import numpy as np

    n = len(keep)
    kept = np.bincount(np.arange(n), weights=keep, minlength=n)
    return (kept + np.bincount(alias, weights=1 - keep, minlength=n)) / n


def test_alias_tables_give_each_successor_its_probability():
    import numpy as np
    from attnbench.train.data import _alias_table

    for probs in [*np.random.default_rng(0).dirichlet(np.ones(8), size=50), np.array([1.0, 0.0, 0.0])]:
        assert _alias_distribution(*_alias_table(probs)) == pytest.approx(probs, abs=1e-12)


def test_synthetic_stream_draws_transitions_at_the_chains_probabilities_in_blocks_of_batches():
    import numpy as np
    from attnbench.train.data import STREAM_BLOCK, _markov_chain

    cfg = DataConfig(source="synthetic-stream", synthetic=SyntheticConfig(vocab=4, order=1, branching=3))
    stream = load_tokens(cfg)
    successors, probs = _markov_chain(cfg.synthetic, np.random.default_rng(cfg.seed))  # the table it was built from
    symbols, _ = stream.windows(np.random.default_rng(0), 2000, 200)
    counts = np.zeros((4, 4))
    np.add.at(counts, (symbols[:, :-1].ravel(), symbols[:, 1:].ravel()), 1)
    for context in range(4):  # ~400k transitions: each context's observed shares within 0.01 of the chain's
        assert counts[context, successors[context]] / counts[context].sum() == pytest.approx(probs[context], abs=0.01)
    # the batches of one block come from one pass; going back to an earlier block draws the same batches again
    first = stream.train_batch(3, 0, 4, 16, "cpu")[0]
    later = stream.train_batch(STREAM_BLOCK + 3, 0, 4, 16, "cpu")[0]
    assert not torch.equal(first, later) and torch.equal(stream.train_batch(3, 0, 4, 16, "cpu")[0], first)
    assert not torch.equal(stream.train_batch(4, 0, 4, 16, "cpu")[0], first)  # the next rows of the same block


def test_lr_schedule_warms_up_then_decays_to_the_floor():
    cfg = TrainConfig(steps=100, lr=1.0, warmup_steps=10, min_lr_ratio=0.1)
    assert lr_at(0, cfg) == pytest.approx(0.1) and lr_at(9, cfg) == pytest.approx(1.0)
    assert lr_at(10, cfg) == pytest.approx(1.0) and lr_at(100, cfg) == pytest.approx(0.1)
    assert all(lr_at(s, cfg) >= lr_at(s + 1, cfg) for s in range(10, 100))


def test_run_writes_step_log_and_summary(tmp_path):
    summary = train(_spec(fp8_stats=("tensorwise",), fp8_stats_every=4, snapshot_steps=(0, 12)), tmp_path, "cpu",
                    peak_flops=1e9, peak_flops_source="a test ceiling")
    steps = pd.read_parquet(tmp_path / "steps.parquet")
    assert len(steps) == 12 and summary["status"] == "ok" and summary["steps_done"] == 12
    for col in ("loss", "grad_norm", "update_rms", "lr", "logz_mean", "tokens_per_s", "memory_bytes", "max_logit_l0",
                "val_loss", "fp8_tensorwise_grad_underflow"):
        assert col in steps, col
    assert steps["max_logit_l0"].notna().sum() == 4  # probe every 3 steps
    assert steps["val_loss"].notna().sum() == 2
    # the work around the timed step is timed where it happened: batch, probe, FP8 statistics, validation, checkpoint
    for column, marks in (("probe_s", "max_logit_l0"), ("fp8_stats_s", "fp8_tensorwise_grad_underflow"),
                          ("val_s", "val_loss"), ("data_s", "loss")):
        assert steps[column].notna().equals(steps[marks].notna()) and (steps[column].dropna() > 0).all(), column
    assert steps.dropna(subset=["ckpt_s"])["step"].tolist() == [3, 7]  # after updates 4 and 8 of 12 (ckpt_every 4)
    assert (steps["update_rms"] > 0).all() and steps["loss"].notna().all()
    assert summary["corpus_sha256"] == load_tokens(SYNTH).sha256
    assert summary["mfu"] > 0 and summary["peak_flops_source"] == "a test ceiling"
    # both spike definitions, windows stated; 12 steps are too few for either window: nothing scored
    assert (summary["spike_window_olmo2_paper"], summary["spike_window_olmo_core"]) == (1000, 128)
    assert math.isnan(summary["spike_score_olmo2_paper_loss"]) and math.isnan(summary["spike_score_olmo_core_any"])
    assert summary["spike_span_olmo_core"] == 12 and math.isnan(summary["spike_min_jump_olmo_core_loss"])
    assert summary["gpu_sharing"] == "unchecked: a cpu run" and summary["gpu_lease"] == ""
    assert (summary["init_seed"], summary["data_seed"]) == (0, 0)
    assert summary["final_val_loss"] < summary["initial_val_loss"]
    assert sorted(p.name for p in (tmp_path / "snapshots").iterdir()) == ["0.pt", "12.pt"]
    snap = torch.load(tmp_path / "snapshots" / "12.pt", weights_only=True)
    assert "wte.weight" in snap and "lm_head.weight" not in snap  # the tied head once
    layers = pd.read_parquet(tmp_path / "fp8_layers.parquet")
    assert set(layers["step"]) == {0, 4, 8} and set(layers["kind"]) == {"act", "weight", "grad"}
    assert set(layers["layer"]) == {"blocks.0.attn.wq", "blocks.0.attn.wk", "blocks.0.attn.wv", "blocks.0.attn.wo",
                                    "blocks.0.mlp.fc", "blocks.0.mlp.proj"}
    at0 = layers[(layers["step"] == 0) & (layers["kind"] == "grad")]
    assert at0["amax"].max() == pytest.approx(steps.loc[0, "fp8_tensorwise_grad_amax"])  # the sum is over layers
    assert not (tmp_path / "ckpt.pt").exists()
    assert train(_spec(fp8_stats=("tensorwise",), fp8_stats_every=4, snapshot_steps=(0, 12)), tmp_path, "cpu") == \
        json.loads((tmp_path / "summary.json").read_text())  # a finished run is not run again


def test_init_and_data_seeds_are_separate(tmp_path):
    runs = {name: _spec(snapshot_steps=(0,), **seeds) for name, seeds in
            {"ref": {}, "init": {"init_seed": 5}, "data": {"data_seed": 5}}.items()}
    steps = {}
    for name, spec in runs.items():
        train(spec, tmp_path / name, "cpu")
        steps[name] = pd.read_parquet(tmp_path / name / "steps.parquet")
    init = {n: torch.load(tmp_path / n / "snapshots" / "0.pt", weights_only=True)["wte.weight"] for n in runs}
    assert torch.equal(init["ref"], init["data"]) and not torch.equal(init["ref"], init["init"])
    data = load_tokens(SYNTH)
    x0, _ = data.train_batch(3, 0, 4, 16, "cpu")
    assert not torch.equal(x0, data.train_batch(3, 5, 4, 16, "cpu")[0])  # the batches follow data_seed alone
    assert steps["ref"]["loss"].iloc[0] != steps["data"]["loss"].iloc[0]  # same weights, other batch
    assert steps["ref"]["loss"].iloc[0] != steps["init"]["loss"].iloc[0]  # same batch, other weights


def test_initial_weights_and_a_data_source_enter_the_run_identity(tmp_path):
    first = train(_spec(), tmp_path / "a", "cpu")
    weights = torch.load(tmp_path / "a" / "final.pt", weights_only=True)

    class Shifted:  # any BatchSource: the loop reads batches, validation batches and an identity
        def __init__(self, data):
            self.data, self.name, self.sha256, self.loss_floor = data, data.name + "+shifted", data.sha256, math.nan

        def train_batch(self, step, seed, batch_size, seq_len, device):
            return self.data.train_batch(step + 1000, seed, batch_size, seq_len, device)

        def val_batches(self, *args):
            return self.data.val_batches(*args)

    tuned = train(_spec(), tmp_path / "b", "cpu", init_state=weights, data=Shifted(load_tokens(SYNTH)))
    assert tuned["config_hash"] != first["config_hash"] and tuned["corpus"].endswith("+shifted")
    assert tuned["initial_val_loss"] == pytest.approx(first["final_val_loss"])  # it started from the weights
    assert tuned["init_sha256"] and json.loads((tmp_path / "b" / "run.json").read_text())["init_sha256"]
    again = train(_spec(), tmp_path / "b", "cpu", init_state=weights, data=Shifted(load_tokens(SYNTH)))
    assert json.dumps(again, sort_keys=True) == json.dumps(tuned, sort_keys=True)  # the same identity: not rerun
    other = train(_spec(), tmp_path / "b", "cpu", data=Shifted(load_tokens(SYNTH)))
    assert other["config_hash"] != tuned["config_hash"]  # other initial weights: trained again


def test_a_run_cut_by_its_time_budget_ends_with_an_evaluation_and_resumes(tmp_path):
    cut = train(_spec(), tmp_path, "cpu", deadline=time.monotonic() - 1)
    assert cut["status"] == "truncated" and cut["steps_done"] == 1 and math.isfinite(cut["final_val_loss"])
    assert (tmp_path / "ckpt.pt").exists()
    done = train(_spec(), tmp_path, "cpu")
    assert done["status"] == "ok" and done["steps_done"] == 12


def test_a_run_that_shared_its_gpu_before_a_cut_stays_shared_after_it_resumes(tmp_path, monkeypatch):
    """Its tokens/s are over both parts' steps, so the part that ran alone does not make it `alone`."""
    from attnbench.train import loop, sharing

    class Seen(sharing.GpuSharing):  # what NVML would have listed: another process in the first part only
        others_now: set[int] = {4242}

        def __init__(self, device):
            super().__init__("cuda")
            self.handle, self.why = "gpu-handle", ""
            Seen.last = self

        def sample(self):
            self.samples += 1
            self.most_others = max(self.most_others, len(Seen.others_now))
            self.others |= Seen.others_now

    monkeypatch.setattr(loop, "GpuSharing", Seen)
    cut = train(_spec(), tmp_path, "cpu", deadline=time.monotonic() - 1)
    assert cut["status"] == "truncated" and cut["gpu_sharing"] == "shared" and cut["gpu_shared_with"] == "4242"
    Seen.others_now = set()
    done = train(_spec(), tmp_path, "cpu")
    assert done["status"] == "ok" and done["steps_done"] == 12
    assert done["gpu_sharing"] == "shared" and done["gpu_shared_with"] == "4242"
    assert cut["gpu_sharing_samples"] > 0 and Seen.last.samples > 0  # the resumed part's own sampler
    assert done["gpu_sharing_samples"] == cut["gpu_sharing_samples"] + Seen.last.samples


def test_speed_is_the_median_and_iqr_after_the_first_tenth_of_steps():
    steps = pd.DataFrame({"tokens_per_s": [1.0] * 2 + [float(v) for v in range(1, 19)]})  # 20 steps, 2 left out
    assert speed_stats(steps) == {"tokens_per_s": 9.5, "tokens_per_s_iqr": 13.75 - 5.25}
    assert all(math.isnan(v) for v in speed_stats(pd.DataFrame({"tokens_per_s": []})).values())


def test_a_killed_run_resumes_on_the_same_trajectory(tmp_path):
    """SIGKILL the `attnbench train` process after its first checkpoint, resume, compare with a whole run."""
    config = {"device": "cpu", "stages": ["pretrain"],
              "microbench": {d: {"backends": ["sdpa-math"], "groups": {"g": {"seq": 16}}} for d in ("cpu", "cuda")},
              "pretrain": {"data": {"source": "synthetic", "synthetic": {"tokens": 20000}},
                           "model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "max_seq_len": 16},
                           "train": {"steps": 400, "batch_size": 4, "seq_len": 16, "eval_every": 100,
                                     "eval_batches": 1, "ckpt_every": 4, "probe_every": 1}}}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    cmd = [sys.executable, "-m", "attnbench.cli", "train", "--config", str(path), "--run", "base", "--no-progress"]
    cut = tmp_path / "cut"
    child = subprocess.Popen(cmd + ["--out", str(cut)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (cut / "ckpt.pt").exists() and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    child.kill()
    child.wait()
    assert (cut / "ckpt.pt").exists() and not (cut / "summary.json").exists()  # killed mid-run
    subprocess.run(cmd + ["--out", str(cut)], check=True, capture_output=True)
    subprocess.run(cmd + ["--out", str(tmp_path / "whole")], check=True, capture_output=True)
    whole = pd.read_parquet(tmp_path / "whole" / "steps.parquet")
    resumed = pd.read_parquet(cut / "steps.parquet")
    cols = ["step", "loss", "grad_norm", "update_rms", "lr", "logz_mean", "val_loss", "max_logit_l0"]
    pd.testing.assert_frame_equal(whole[cols], resumed[cols])


def test_nonfinite_steps_are_counted_and_end_the_run_without_raising(tmp_path):
    summary = train(_spec(lr=1e30, grad_clip=0.0, max_nonfinite=3, warmup_steps=0), tmp_path, "cpu")
    assert summary["status"] == "diverged" and "consecutive non-finite" in summary["reason"]
    assert summary["nonfinite_steps"] == 3 and summary["steps_done"] < 12
    steps = pd.read_parquet(tmp_path / "steps.parquet")
    assert steps["skipped"].iloc[-3:].all()


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_low_precision_runs_train(tmp_path, precision):
    summary = train(_spec(precision=precision), tmp_path, "cpu")
    steps = pd.read_parquet(tmp_path / "steps.parquet")
    assert summary["status"] == "ok" and summary["final_val_loss"] < summary["initial_val_loss"]
    assert steps["loss_scale"].notna().all() == (precision == "fp16")


def test_fp8_without_torchao_is_an_unavailable_row(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torchao", None)  # `import torchao` raises ImportError, installed or not
    summary = train(_spec(precision="fp8-rowwise"), tmp_path, "cpu")
    assert summary["status"] == "unavailable" and "torchao" in summary["reason"]


@pytest.mark.parametrize("precision", ["fp8-tensorwise", "fp8-rowwise", "mxfp8"])
def test_fp8_with_torchao_trains_emulated_on_cpu(tmp_path, precision):
    pytest.importorskip("torchao")
    if torch.cuda.is_available():
        pytest.skip("checks the CPU emulation path")
    model = dataclasses.replace(TINY_MODEL, d_model=32)  # MXFP8 blocks of 32 along every reduced dim
    summary = train(RunSpec("t", model, dataclasses.replace(TINY_TRAIN, precision=precision), SYNTH),
                    tmp_path, "cpu")
    assert summary["status"] == "ok" and summary["emulated"] and math.isnan(summary["tokens_per_s"])


def test_mx_quantize_known_values():
    x = torch.zeros(2, 32)
    x[0, :6] = torch.tensor([3.0, 1.1, 0.01, 1e-5, 1.0625, -3.0])
    # amax 3: X = 2^ceil(log2(3/448)) = 2^-7, so elements are x * 128 on the e4m3 grid, then / 128
    # 1.1*128 = 140.8 -> 144 (ulp 16); 0.01*128 = 1.28 -> 1.25 (ulp 1/8); 1e-5*128 -> 2^-9 (smallest subnormal);
    # 1.0625*128 = 136, a tie between 128 and 144 -> 128 (even mantissa)
    expected = [3.0, 1.125, 1.25 / 128, 2.0 ** -16, 1.0, -3.0]
    q = mx_quantize(x, 1)
    assert q[0, :6].tolist() == expected and (q[0, 6:] == 0).all() and (q[1] == 0).all()  # a zero block stays zero
    assert FORMATS["e4m3"].round(torch.tensor([440.0, 470.0, -1e6])).tolist() == [448.0, 448.0, -448.0]  # saturates, no NaN
    # amax 449 needs X = 2: 449/2 = 224.5 -> 224, so it comes back as 448, not above
    assert mx_quantize(torch.tensor([[449.0, 1.0]]), 1).tolist() == [[448.0, 1.0]]  # 2 elements: padded block
    assert mx_quantize(x.bfloat16(), 1).dtype == torch.bfloat16


def test_mx_quantize_blocks_follow_the_dim():
    x = torch.full((64, 2), 1e-4)
    x[0, 0] = 448.0  # X = 1 in its block: 1e-4 is below half the smallest e4m3 subnormal (2^-10), so it flushes
    kept = mx_quantize(torch.full((32, 1), 1e-4), 0)[0, 0].item()
    along_rows = mx_quantize(x, 0)  # blocks: rows 0-31 and 32-63 of each column
    assert along_rows[0, 0] == 448 and (along_rows[1:32, 0] == 0).all()
    assert (along_rows[32:, 0] == kept).all() and (along_rows[:, 1] == kept).all()
    along_cols = mx_quantize(x, 1)  # blocks: each row (2 elements, padded)
    assert along_cols[0].tolist() == [448.0, 0.0] and (along_cols[1:] == kept).all()
    assert kept == pytest.approx(1e-4, rel=2 ** -4)


@pytest.mark.parametrize("shape", [(2, 20, 48), (64, 32)])  # tokens and in_features not multiples of 32; exact ones
def test_mxfp8_linear_runs_three_quantised_gemms(shape):
    torch.manual_seed(0)
    linear = torch.nn.Linear(shape[-1], 48)
    mx = MXFP8EmulatedLinear.from_linear(linear)
    assert mx.weight is linear.weight and mx.state_dict().keys() == linear.state_dict().keys()
    x = torch.randn(shape, requires_grad=True)
    dy = torch.randn(*shape[:-1], 48)
    y = mx(x)
    y.backward(dy)
    x2, dy2, w = x.detach().reshape(-1, shape[-1]), dy.reshape(-1, 48), linear.weight.detach()
    q = mx_quantize  # the reference: M = tokens, K = in_features, N = out_features
    torch.testing.assert_close(y.detach().reshape(-1, 48), q(x2, 1) @ q(w, 1).t() + linear.bias.detach())
    torch.testing.assert_close(x.grad.reshape(-1, shape[-1]), q(dy2, 1) @ q(w, 0))
    torch.testing.assert_close(linear.weight.grad, q(dy2, 0).t() @ q(x2, 0))
    torch.testing.assert_close(linear.bias.grad, dy2.sum(0))
    exact = torch.nn.functional.linear(x, w)
    assert not torch.equal(y.detach() - linear.bias.detach(), exact)  # quantised ...
    torch.testing.assert_close(y.detach() - linear.bias.detach(), exact.detach(), rtol=0, atol=0.5)  # ... but close


def test_mxfp8_linear_computes_in_bf16_under_autocast():
    linear = torch.nn.Linear(32, 32, bias=False)
    mx = MXFP8EmulatedLinear.from_linear(linear)
    x = torch.randn(8, 32, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = mx(x)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert x.grad.dtype == torch.float32 and linear.weight.grad.dtype == torch.float32
    xb, wb = x.detach().bfloat16(), linear.weight.detach().bfloat16()
    torch.testing.assert_close(y, mx_quantize(xb, 1) @ mx_quantize(wb, 1).t())


def test_mxfp8_trains_emulated_on_cpu_with_or_without_torchao(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("checks the CPU emulation path")
    model = dataclasses.replace(TINY_MODEL, d_model=32)
    runs = {p: train(RunSpec("t", model, dataclasses.replace(TINY_TRAIN, precision=p), SYNTH), tmp_path / p, "cpu")
            for p in ("bf16", "mxfp8")}
    mx = runs["mxfp8"]
    assert mx["status"] == "ok" and mx["emulated"] and math.isnan(mx["tokens_per_s"])
    assert "attnbench MXFP8 emulation" in mx["reason"] and "capability >= 10.0 (here: cpu)" in mx["reason"]
    assert mx["final_val_loss"] < mx["initial_val_loss"]
    assert mx["final_val_loss"] == pytest.approx(runs["bf16"]["final_val_loss"], rel=0.02)
    assert mx["final_val_loss"] != runs["bf16"]["final_val_loss"]  # it did quantise


def test_mxfp8_falls_back_to_the_emulation_when_torchao_refuses(monkeypatch):
    from attnbench.models.gpt import GPT
    from attnbench.train import precision as prec

    monkeypatch.setattr(prec, "_capability", lambda device: (10, 0))  # as on a Blackwell GPU
    model = GPT(dataclasses.replace(TINY_MODEL, d_model=32))
    emulated, note = prec.apply_precision(model, get_precision("mxfp8"), "cpu")
    # without torchao: not installed; with torchao 0.18 on CPU its MXFP8 fails, and the model is left to the emulation
    assert emulated and "not torchao because" in note and "capability" not in note, note
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert [type(m) for m in linears].count(MXFP8EmulatedLinear) == len(linears) - 1  # all but the tied head
    assert all(type(m.weight) is torch.nn.Parameter for m in linears)  # no torchao wrapper left behind


def test_mx_quantize_matches_torchao_mxtensor():
    pytest.importorskip("torchao")
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.prototype.mx_formats.mx_tensor import MXTensor

    torch.manual_seed(0)
    x = torch.randn(64, 96) * torch.logspace(-6, 4, 96)  # blocks over ten decades
    for dtype in (torch.float32, torch.bfloat16):
        xd = x.to(dtype)
        for dim, t in ((1, xd), (0, xd.t().contiguous())):
            ref = MXTensor.to_mx(t, torch.float8_e4m3fn, 32, ScaleCalculationMode.RCEIL).dequantize(dtype)
            assert torch.equal(mx_quantize(xd, dim), ref if dim == 1 else ref.t())


def test_fp8_tensor_stats_known_values():
    x = torch.tensor([[2.0, -1.0, 1e-7, 0.0]])
    s = fp8_tensor_stats(x, "tensorwise", "e4m3")
    assert s.amax == 2.0 and s.log2_scale_sum == pytest.approx(math.log2(448 / 2))
    assert s.overflow == 0 and s.nonzero == 3 and s.underflow == 1  # 1e-7 * 224 < 2^-10: rounds to 0 in e4m3
    g = fp8_tensor_stats(x, "tensorwise", "e5m2")
    assert g.underflow == 0  # e5m2 reaches 2^-16 and 1e-7 * 28672 is above it
    block = torch.full((1, 32), 0.5)
    block[0, 0] = 1.9  # OCP floor scale 2^(0 - 8): 1.9 * 256 = 486 > 448 saturates; RCEIL scales under 448
    assert fp8_tensor_stats(block, "mxfp8-floor", "e4m3").overflow == 1
    assert fp8_tensor_stats(block, "mxfp8", "e4m3").overflow == 0
    rows = fp8_tensor_stats(torch.tensor([[3.0, 1.0], [0.1, 0.05]]), "rowwise", "e4m3")
    assert rows.groups == 2 and rows.log2_scale_sum == pytest.approx(7 + 12)  # floor(log2(448/3)), floor(log2(4480))


def test_fp8_recorder_sees_inputs_weights_and_output_gradients():
    model = torch.nn.Sequential(torch.nn.Linear(16, 32, bias=False), torch.nn.Linear(32, 16, bias=False))
    rec = Fp8StatsRecorder(model, ("tensorwise", "mxfp8"))
    model(torch.randn(4, 16)).sum().backward()
    assert rec.row() == {}  # not recording
    with rec.recording():
        model(torch.randn(4, 16)).sum().backward()
    row = rec.row()
    assert {k.rsplit("_", 1)[0] for k in row} >= {f"fp8_{r}_{t}" for r in ("tensorwise", "mxfp8")
                                                  for t in ("act", "weight", "grad")}
    # d(sum)/d(out of layer 1) is all ones; into layer 0's output it is W1^T 1, i.e. the column sums of W1
    expected = max(1.0, model[1].weight.detach().sum(0).abs().max().item())
    assert row["fp8_tensorwise_grad_amax"] == pytest.approx(expected, rel=1e-5)


def test_fp8_recorder_waits_for_the_device_once_a_recording(monkeypatch):
    """No count leaves the device while the model runs, and no host value is copied to it; the first summary moves
    them all at once and they equal the per-tensor statistics (a layer's counts summed over its calls)."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=64, d_model=64, n_layers=2, n_heads=4, max_seq_len=32, backend="sdpa-math"))
    rec = Fp8StatsRecorder(model, STATS_RECIPES)
    seen, record = {}, rec._record

    def keep(layer, kind, tensor):  # returns None: it is also a gradient hook
        seen.setdefault((layer, kind), []).append(tensor.detach().clone())
        record(layer, kind, tensor)

    monkeypatch.setattr(rec, "_record", keep)
    x, reads = torch.randint(0, 64, (4, 32)), []
    for name in ("item", "tolist", "__float__", "__int__", "__bool__"):
        original = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda self, *a, _name=name, _original=original, **k: (
            reads.append(_name), _original(self, *a, **k))[1])
    monkeypatch.setattr(torch, "tensor", lambda *a, _original=torch.tensor, **k: (  # host data copied to the device
        reads.append("tensor"), _original(*a, **k))[1])
    with rec.recording():
        model(x).float().logsumexp(-1).mean().backward()
    assert reads == []
    summaries = rec.summaries()
    assert reads == ["tolist"] and rec.summaries() is summaries  # one transfer, kept for row() and layer_rows()
    monkeypatch.undo()
    assert len(summaries) == len(seen) * len(STATS_RECIPES) == len(rec.handles) * 3 * len(STATS_RECIPES)
    for (layer, recipe, kind), got in summaries.items():
        want = Fp8Stats()
        for t in seen[(layer, kind)]:
            want.add(fp8_tensor_stats(t, recipe, RECIPE_FORMATS[recipe][TENSOR_KINDS.index(kind)]))
        assert got == want


def test_precision_names():
    assert get_precision("fp16").loss_scaling and get_precision("bf16").matmul_dtype == "bf16"
    assert get_precision("mxfp8").matmul_dtype == "fp8"
    with pytest.raises(ValueError, match="train.precision='fp4'"):
        get_precision("fp4")


def test_tokens_per_joule_over_the_warm_steps():
    from attnbench.train.loop import tokens_per_joule

    steps = pd.DataFrame({"tokens_per_s": [1000.0] * 20, "step_s": [0.5] * 20,  # 500 tokens a step
                          "energy_j": [99.0] * 2 + [2.0] * 18})  # the first tenth (warm-up) is left out
    assert tokens_per_joule(steps) == 250.0
    assert math.isnan(tokens_per_joule(steps.assign(energy_j=float("nan"))))  # CPU, or no NVML
