"""The capability experiment: pretrain at length L, extend with each RoPE scaling, measure.

Protocol (after Chen et al. 2023 "PI", section 3, and Peng et al. 2023 "YaRN", section 4, at small scale):

1. :func:`pretrain` a tiny GPT (:mod:`attnbench.models.gpt`) with plain RoPE at length L
   on the byte-level corpus, with a share of each batch replaced by passkey documents
   (:class:`attnbench.context.passkey.PasskeyMixture`) so that retrieval is a skill the model has at L.
2. For each method and each extension factor s (target window sL), :func:`variants`
   lists the model variants: the pretrained weights with the method's RoPE and no
   training ("no fine-tune"), and the same after a short fine-tune at length sL on the
   same mixture (``finetune.fraction`` of the pretraining steps; PI: 1000 steps, YaRN:
   400). ``none`` fine-tuned at sL is PI's direct-fine-tuning baseline. Dynamic NTK
   needs no s (it rescales by the current length, s = max(1, S / L)); its fine-tuned
   variants are fine-tuned at sL.
3. :func:`evaluate` scores every variant at every evaluation length L * f: sliding-window
   perplexity (``eval.stride``), one truncated window per held-out document
   (``eval.n_docs``), and passkey retrieval (``passkey.n`` documents).

Only the RoPE tables change between a model and its no-fine-tune variants: weights
are copied unchanged, since ``inv_freq`` and the cos/sin tables are non-persistent buffers.

Pretraining and every fine-tune run through the project's one training loop,
:func:`attnbench.train.loop.train` (AdamW with decay on matrices, linear warm-up then cosine to
10%, gradient clipping at 1, ``pretrain.precision``), each into a run directory of its own
(``run.json``, ``steps.parquet``, ``summary.json``, ``final.pt``; checkpoints while it runs, so a
killed job resumes): the pretraining run beside the checkpoint file, the fine-tunes under the
evaluation job's output. The batch source is the passkey mixture; a fine-tune starts from the
pretrained weights (the loop's ``init_state``), with the variant's RoPE.
"""
from __future__ import annotations

import dataclasses
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pandas as pd
import torch

from attnbench.failures import classify
from attnbench.bench.provenance import environment, timestamp
from attnbench.errors import ConfigError
from attnbench.jobs import Job
from attnbench.context import passkey
from attnbench.context.perplexity import document_starts, sliding_window_score, truncated_window_score
from attnbench.kernels.registry import backend_names
from attnbench.models.gpt import GPT, GPTConfig
from attnbench.models.rope import METHODS, RopeConfig, RopeConfigError
from attnbench.train.checkpoint import load_weights
from attnbench.train.data import BatchSource, DataConfig, TokenData, load_tokens
from attnbench.train.loop import RunSpec, TrainConfig, train
from attnbench.train.precision import get_precision

Log = Callable[[str], None]
MAX_EVAL_FACTOR = 64  # evaluation lengths beyond 64 x train_len are refused at planning time
CHECKPOINT_KEYS = ("model_config", "state_dict", "losses", "train_s", "params", "data", "data_sha256",
                   "spec")  # what pretrain() returns


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Variant:
    """One extended model: a RoPE method, the window sL it targets, and its fine-tune steps (0: none)."""

    method: str
    factor: float
    finetune_steps: int

    @property
    def rope_factor(self) -> float:
        """What the RoPE config gets: s, except none (1) and dynamic NTK (1: it scales by the current length)."""
        return 1.0 if self.method in ("none", "dynamic_ntk") else self.factor


def check_capability(spec: dict, where: str) -> dict:
    """Everything about ``context.capability`` that its schema cannot check, at planning time: the
    model and every method's RoPE at every factor build, passkey documents fit, evaluation lengths
    stay within :data:`MAX_EVAL_FACTOR` times the training length. Returns ``spec``."""
    check_spec(spec)
    DataConfig.from_dict(spec["data"])
    if spec["pretrain"]["warmup_steps"] > spec["pretrain"]["steps"]:
        raise ConfigError(f"{where}.pretrain.warmup_steps={spec['pretrain']['warmup_steps']} is longer than "
                          f"pretrain.steps={spec['pretrain']['steps']}; allowed: at most pretrain.steps warm-up steps")
    too_long = [f for f in spec["eval_factors"] if f > MAX_EVAL_FACTOR]
    if too_long:
        raise ConfigError(f"{where}.eval_factors: {too_long[0]!r} is not allowed; allowed: factors up to "
                          f"{MAX_EVAL_FACTOR} (evaluation lengths up to {MAX_EVAL_FACTOR} x train_len)")
    for method in spec["methods"]:
        for variant in variants(spec, method):
            rope_config(spec, variant.method, variant.rope_factor)
    model = _model_config(spec, rope_config(spec, "none", 1.0), spec["train_len"])
    if model.backend not in backend_names():
        raise ConfigError(f"{where}.model.backend={model.backend!r} is not known; "
                          f"allowed: {', '.join(backend_names())}")
    return spec


def capability_jobs(spec: dict, sweep: str, device: str) -> list:
    """The pretraining job, then one evaluation job per method. The pretraining job's file leaves the
    methods out, so adding a method to a sweep does not pretrain again."""
    base = {k: v for k, v in spec.items() if k != "methods"}
    jobs = [Job("context", "capability-pretrain", {"stage": "context-pretrain", "sweep": sweep, "device": device,
                                                   "spec": base})]
    jobs += [Job("context", f"capability-{method}", {"stage": "context-evaluate", "sweep": sweep, "device": device,
                                                     "spec": base, "method": method}) for method in spec["methods"]]
    return jobs


def rope_config(spec: dict, method: str, factor: float) -> RopeConfig:
    """The ``context.capability.rope`` parameters with this method and factor; errors name the key."""
    try:
        return RopeConfig.from_dict({**spec["rope"], "method": method, "factor": factor,
                                     "original_max_len": spec["train_len"]})
    except RopeConfigError as err:
        raise ConfigError(f"context.capability.{err}") from None


def check_spec(spec: dict) -> None:
    """What the schema cannot check: passkey documents must fit in a pretraining sequence."""
    pk = spec["passkey"]
    if pk["enabled"] and pk["train_fraction"] > 0 and spec["train_len"] + 1 < passkey.min_length(pk["digits"]):
        raise ConfigError(f"context.capability.passkey.enabled: passkey documents need "
                          f"{passkey.min_length(pk['digits'])} tokens, more than train_len={spec['train_len']} + 1; "
                          "raise train_len or set passkey.enabled: false")


def finetune_steps(spec: dict) -> int:
    return max(1, round(spec["finetune"]["fraction"] * spec["pretrain"]["steps"]))


def variants(spec: dict, method: str) -> list[Variant]:
    """Every variant of ``method`` the experiment evaluates (see the module docstring)."""
    if method not in METHODS:
        raise ConfigError(f"context.capability.methods: {method!r} is not allowed; allowed: {', '.join(METHODS)}")
    factors = spec["extension_factors"]
    steps = finetune_steps(spec) if spec["finetune"]["enabled"] else 0
    fixed = method in ("none", "dynamic_ntk")
    out = [Variant(method, 1.0, 0)] if fixed else [Variant(method, float(s), 0) for s in factors]
    if steps:
        out += [Variant(method, float(s), steps) for s in factors]
    return out


def eval_lengths(spec: dict) -> list[int]:
    return [int(spec["train_len"] * f) for f in spec["eval_factors"]]


# ---- training ----------------------------------------------------------------------------------------------

def train_config(spec: dict, *, steps: int, lr: float, warmup: int, seq_len: int, seed: int) -> TrainConfig:
    """The loop's config for a pretraining or fine-tuning run: ``pretrain.batch_tokens`` per step at ``seq_len``,
    ``pretrain.weight_decay`` and ``pretrain.precision``; one validation batch at the start and the end;
    no attention-logit probe. ``seed`` sets both the initial weights and the batch order."""
    opt = spec["pretrain"]
    return TrainConfig(steps=steps, batch_size=max(1, opt["batch_tokens"] // seq_len), seq_len=seq_len, lr=lr,
                       warmup_steps=warmup, weight_decay=opt["weight_decay"], precision=opt["precision"],
                       init_seed=seed, data_seed=seed, eval_every=steps, eval_batches=1, probe_every=0)


def training_data(spec: dict, text: TokenData) -> BatchSource:
    """The batches: text windows, with ``passkey.train_fraction`` of each batch passkey documents when enabled."""
    pk = spec["passkey"]
    if pk["enabled"] and pk["train_fraction"] > 0:
        return passkey.PasskeyMixture(text, pk["train_fraction"], pk["digits"])
    return text


def _train(spec: dict, run: RunSpec, folder: Path, device: str, text: TokenData, progress: bool,
           init_state: dict | None = None) -> tuple[dict, list[float]]:
    """One run of the loop; (summary, loss per step). A run that cannot train or diverges is an error here: the
    experiment's later steps need its weights."""
    summary = train(run, folder, device, progress=progress, data=training_data(spec, text), init_state=init_state)
    if summary["status"] != "ok":
        raise RuntimeError(f"context.capability: {run.name} ended {summary['status']}: {summary.get('reason', '')}")
    return summary, pd.read_parquet(Path(folder) / "steps.parquet")["loss"].tolist()


def _model_config(spec: dict, rope: RopeConfig, max_seq_len: int) -> GPTConfig:
    try:
        return GPTConfig.from_dict({**spec["model"], "rope": rope, "max_seq_len": max_seq_len})
    except ConfigError as err:
        raise ConfigError(f"context.capability.{err}") from None


def load_data(spec: dict) -> TokenData:
    return load_tokens(DataConfig.from_dict(spec["data"]))


def pretrain(spec: dict, device: str, run_dir: str | Path, log: Log = _stderr, progress: bool = True) -> dict:
    """Pretrain at L with plain RoPE into ``run_dir``; returns a checkpoint dict (config, weights, losses,
    provenance)."""
    check_spec(spec)
    data = load_data(spec)
    cfg = _model_config(spec, rope_config(spec, "none", 1.0), spec["train_len"])
    p = spec["pretrain"]
    tcfg = train_config(spec, steps=p["steps"], lr=p["lr"], warmup=p["warmup_steps"], seq_len=spec["train_len"],
                        seed=spec["seed"])
    run = RunSpec("context/pretrain", cfg, tcfg, DataConfig.from_dict(spec["data"]),
                  {"experiment": "context_capability"})
    summary, losses = _train(spec, run, Path(run_dir), device, data, progress)
    log(f"pretrain: {len(losses)} steps at length {spec['train_len']}, batch {tcfg.batch_size}, "
        f"final loss {losses[-1]:.4f} ({run_dir})")
    state = load_weights(Path(run_dir) / "final.pt")
    return {"model_config": cfg.to_dict(), "state_dict": state, "losses": losses, "train_s": summary["wall_s"],
            "params": summary["params"], "data": data.name, "data_sha256": data.sha256, "spec": spec,
            "run_dir": str(run_dir)}


def extended_config(checkpoint: dict, spec: dict, variant: Variant, max_len: int) -> GPTConfig:
    """The pretrained model's config with ``variant``'s RoPE, tables sized for ``max_len``."""
    trained = GPTConfig.from_dict(checkpoint["model_config"])
    rope = rope_config(spec, variant.method, variant.rope_factor)
    try:
        rope.check_model_len(trained.max_seq_len)
    except RopeConfigError as err:
        raise ConfigError(f"context.capability.{err}") from None
    return dataclasses.replace(trained, rope=rope, max_seq_len=max_len)


def extended_model(checkpoint: dict, spec: dict, variant: Variant, device: str, max_len: int,
                   state: dict | None = None) -> GPT:
    """The pretrained weights (or ``state``, a fine-tune's) with ``variant``'s RoPE (tables sized for ``max_len``)."""
    model = GPT(extended_config(checkpoint, spec, variant, max_len)).to(device)
    model.load_state_dict(checkpoint["state_dict"] if state is None else state)
    model.eval()
    return model


def finetune(checkpoint: dict, spec: dict, variant: Variant, device: str, max_len: int, run_dir: str | Path,
             progress: bool = True) -> tuple[dict, dict, list[float]]:
    """Fine-tune the pretrained weights with ``variant``'s RoPE at its window sL for ``variant.finetune_steps`` steps
    (``finetune.lr``, a tenth of them warm-up); returns (the fine-tuned state dict, summary, loss per step)."""
    ft_len = int(round(spec["train_len"] * variant.factor))
    tcfg = train_config(spec, steps=variant.finetune_steps, lr=spec["finetune"]["lr"],
                        warmup=max(1, variant.finetune_steps // 10), seq_len=ft_len, seed=spec["seed"] + 1 + ft_len)
    run = RunSpec(f"context/finetune/{variant.method}-s{variant.factor:g}",
                  extended_config(checkpoint, spec, variant, max_len), tcfg, DataConfig.from_dict(spec["data"]),
                  {"experiment": "context_capability", "method": variant.method})
    summary, losses = _train(spec, run, Path(run_dir), device, load_data(spec), progress, checkpoint["state_dict"])
    return load_weights(Path(run_dir) / "final.pt"), summary, losses


# ---- evaluation -----------------------------------------------------------------------------------------------

def _forward(model: GPT, device: str, precision: str):
    """The model as a LanguageModel, under the runs' precision (``pretrain.precision``)."""
    autocast = get_precision(precision).autocast(device)

    def run(tokens: torch.Tensor) -> torch.Tensor:
        with torch.no_grad(), autocast:
            return model(tokens.to(device)).float()
    return run


def _score_variant(model: GPT, variant: Variant, spec: dict, data: TokenData, device: str) -> list[dict]:
    ev, pk = spec["eval"], spec["passkey"]
    lengths = eval_lengths(spec)
    text = data.val[: max(ev["tokens"], max(lengths))].long()
    if text.numel() < max(lengths):
        raise ConfigError(f"context.capability.eval: the validation split has {text.numel()} tokens, fewer than the "
                          f"longest evaluation length {max(lengths)}")
    starts = document_starts(len(data.val), max(lengths), ev["n_docs"])
    docs = torch.stack([data.val[s:s + max(lengths)].long() for s in starts])
    fwd = _forward(model, device, spec["pretrain"]["precision"])
    rows = []
    for length in lengths:
        base = {"eval_len": length, "status": "ok", "reason": ""}
        start = time.perf_counter()
        try:
            stride = min(ev["stride"], length)
            s = sliding_window_score(fwd, text, length, stride, ev["batch_size"])
            rows.append({**base, "eval": "sliding", "stride": stride, "n_tokens": s.n_tokens, "nll": s.nll,
                         "ppl": s.ppl, "eval_s": time.perf_counter() - start})
            start = time.perf_counter()
            s = truncated_window_score(fwd, docs, length, ev["batch_size"])
            rows.append({**base, "eval": "truncated", "n_docs": len(starts), "n_tokens": s.n_tokens, "nll": s.nll,
                         "ppl": s.ppl, "eval_s": time.perf_counter() - start})
            if pk["enabled"] and length >= passkey.min_length(pk["digits"]):
                start = time.perf_counter()
                depths = [(i + 0.5) / pk["n"] for i in range(pk["n"])]
                batch = passkey.make_batch(pk["n"], length, digits=pk["digits"], seed=spec["seed"] + 7919 + length,
                                           depths=depths)
                r = passkey.score(fwd, batch, ev["batch_size"])
                rows.append({**base, "eval": "passkey", "n_docs": r.n, "accuracy": r.accuracy,
                             "digit_accuracy": r.digit_accuracy, "eval_s": time.perf_counter() - start})
        except torch.OutOfMemoryError as err:
            rows.append({**base, "eval": "sliding", "status": "oom", "reason": classify(err)[1]})
            if device == "cuda":
                torch.cuda.empty_cache()
    return rows


def evaluate(checkpoint: dict, spec: dict, method: str, device: str, run_dir: str | Path, log: Log = _stderr,
             progress: bool = True) -> list[dict]:
    """Rows for every variant of ``method``: its fine-tune (if any, a run under ``run_dir``) and its scores at every
    evaluation length."""
    data = load_data(spec)
    env = environment(device)
    lengths = eval_lengths(spec)
    pretrain_loss = checkpoint["losses"][-1] if checkpoint["losses"] else float("nan")
    rows = []
    for variant in variants(spec, method):
        ft_len, ft_loss, ft_s, state = 0, float("nan"), 0.0, None
        if variant.finetune_steps:
            ft_len = int(round(spec["train_len"] * variant.factor))
            state, summary, losses = finetune(checkpoint, spec, variant, device, max(lengths),
                                              Path(run_dir) / f"{method}-s{variant.factor:g}", progress)
            ft_loss, ft_s = losses[-1], summary["wall_s"]
        model = extended_model(checkpoint, spec, variant, device, max(lengths), state)
        for row in _score_variant(model, variant, spec, data, device):
            rows.append({"experiment": "context_capability", "method": method, "factor": variant.factor,
                         "rope_factor": variant.rope_factor, "finetune_steps": variant.finetune_steps,
                         "finetune_len": ft_len, "finetune_final_loss": ft_loss, "finetune_s": ft_s,
                         "train_len": spec["train_len"], "pretrain_steps": spec["pretrain"]["steps"],
                         "pretrain_final_loss": pretrain_loss, "params": checkpoint["params"],
                         "data": checkpoint["data"], "data_sha256": checkpoint["data_sha256"],
                         "seed": spec["seed"], **row, "device": device, "device_name": env["device_name"],
                         "torch_version": env["torch_version"], "git_sha": env["git_sha"], "timestamp": timestamp()})
        done = [r for r in rows if r["factor"] == variant.factor and r["finetune_steps"] == variant.finetune_steps]
        log(f"{method} s={variant.factor:g} ft={variant.finetune_steps}: " + ", ".join(
            f"{r['eval_len']}:{r['ppl']:.2f}" for r in done if r["eval"] == "sliding" and r["status"] == "ok"))
        del model
    return rows
