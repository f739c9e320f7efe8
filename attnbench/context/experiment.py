"""The capability experiment: pretrain at length L, extend with each RoPE scaling, measure.

Protocol (after Chen et al. 2023 "PI", section 3, and Peng et al. 2023 "YaRN", section 4, at small scale):

1. :func:`pretrain` a tiny GPT (:mod:`attnbench.models.gpt`) with plain RoPE at length L
   on the byte-level corpus, with a share of each batch replaced by passkey documents
   (:mod:`attnbench.context.passkey`) so that retrieval is a skill the model has at L.
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
"""
from __future__ import annotations

import copy
import dataclasses
import sys
import time
from dataclasses import dataclass
from typing import Callable

import torch

from attnbench.failures import classify
from attnbench.bench.provenance import environment, timestamp
from attnbench.errors import ConfigError
from attnbench.context import passkey
from attnbench.context.perplexity import document_starts, sliding_window_score, truncated_window_score
from attnbench.kernels.registry import backend_names
from attnbench.models.gpt import GPT, GPTConfig
from attnbench.models.rope import METHODS, RopeConfig, RopeConfigError
from attnbench.train.data import DataConfig, TokenData, load_tokens
from attnbench.train.loop import TrainConfig, lm_loss, lr_at

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
    from attnbench.plan import Job

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


# ---- training -------------------------------------------------------------------------------------------------

def _mixture_batch(data: TokenData, spec: dict, step: int, seed: int, batch_size: int, seq_len: int, device: str):
    """(x, y) of text windows with ``passkey.train_fraction`` of the rows replaced by passkey documents."""
    x, y = data.train_batch(step, seed, batch_size, seq_len, device)
    pk = spec["passkey"]
    n_pk = round(pk["train_fraction"] * batch_size) if pk["enabled"] else 0
    if n_pk:
        docs = passkey.make_batch(n_pk, seq_len + 1, digits=pk["digits"], seed=seed * 1_000_003 + step).tokens
        x[:n_pk], y[:n_pk] = docs[:, :-1].to(device), docs[:, 1:].to(device)
    return x, y


def train(model: GPT, data: TokenData, spec: dict, *, steps: int, lr: float, warmup: int, seq_len: int,
          seed: int, device: str, log: Log = _stderr, tag: str = "") -> list[float]:
    """AdamW steps on the mixture at ``seq_len``, a fixed number of tokens per step; returns the loss per step.

    The schedule and loss are the pretraining stage's (:func:`attnbench.train.loop.lr_at`, ``lm_loss``).
    """
    opt_cfg = spec["pretrain"]
    batch = max(1, opt_cfg["batch_tokens"] // seq_len)
    schedule = TrainConfig(steps=steps, lr=lr, warmup_steps=warmup, weight_decay=opt_cfg["weight_decay"])
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": schedule.weight_decay},
                             {"params": other, "weight_decay": 0.0}], lr=lr, betas=(schedule.beta1, schedule.beta2))
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device == "cuda" else torch.autocast("cpu", enabled=False)
    losses = []
    model.train()
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, schedule)
        x, y = _mixture_batch(data, spec, step, seed, batch, seq_len, device)
        with autocast:
            logits = model(x)
        loss, _ = lm_loss(logits, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), schedule.grad_clip)
        opt.step()
        losses.append(loss.item())
        if step % max(1, steps // 5) == 0 or step == steps - 1:
            log(f"{tag}step {step + 1}/{steps} len {seq_len} batch {batch} loss {losses[-1]:.4f}")
    model.eval()
    return losses


def _model_config(spec: dict, rope: RopeConfig, max_seq_len: int) -> GPTConfig:
    try:
        return GPTConfig.from_dict({**spec["model"], "rope": rope, "max_seq_len": max_seq_len})
    except ConfigError as err:
        raise ConfigError(f"context.capability.{err}") from None


def load_data(spec: dict) -> TokenData:
    return load_tokens(DataConfig.from_dict(spec["data"]))


def pretrain(spec: dict, device: str, log: Log = _stderr) -> dict:
    """Pretrain at L with plain RoPE; returns a checkpoint dict (config, weights, losses, provenance)."""
    check_spec(spec)
    torch.manual_seed(spec["seed"])
    data = load_data(spec)
    cfg = _model_config(spec, rope_config(spec, "none", 1.0), spec["train_len"])
    model = GPT(cfg).to(device)
    p = spec["pretrain"]
    start = time.perf_counter()
    losses = train(model, data, spec, steps=p["steps"], lr=p["lr"], warmup=p["warmup_steps"],
                   seq_len=spec["train_len"], seed=spec["seed"], device=device, log=log, tag="pretrain ")
    return {"model_config": cfg.to_dict(), "state_dict": {k: v.cpu() for k, v in model.state_dict().items()},
            "losses": losses, "train_s": time.perf_counter() - start, "params": model.num_params(),
            "data": data.name, "data_sha256": data.sha256, "spec": spec}


def extended_model(checkpoint: dict, spec: dict, variant: Variant, device: str, max_len: int) -> GPT:
    """The pretrained weights with ``variant``'s RoPE (tables sized for ``max_len``)."""
    trained = GPTConfig.from_dict(checkpoint["model_config"])
    rope = rope_config(spec, variant.method, variant.rope_factor)
    try:
        rope.check_model_len(trained.max_seq_len)
    except RopeConfigError as err:
        raise ConfigError(f"context.capability.{err}") from None
    model = GPT(dataclasses.replace(trained, rope=rope, max_seq_len=max_len)).to(device)
    model.load_state_dict(checkpoint["state_dict"])
    model.eval()
    return model


# ---- evaluation -----------------------------------------------------------------------------------------------

def _forward(model: GPT, device: str):
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device == "cuda" else torch.autocast("cpu", enabled=False)

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
    fwd = _forward(model, device)
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


def evaluate(checkpoint: dict, spec: dict, method: str, device: str, log: Log = _stderr) -> list[dict]:
    """Rows for every variant of ``method``: its fine-tune (if any) and its scores at every evaluation length."""
    data = load_data(spec)
    env = environment(device)
    lengths = eval_lengths(spec)
    pretrain_loss = checkpoint["losses"][-1] if checkpoint["losses"] else float("nan")
    rows = []
    for variant in variants(spec, method):
        model = extended_model(checkpoint, spec, variant, device, max(lengths))
        ft_len, ft_loss, ft_s = 0, float("nan"), 0.0
        if variant.finetune_steps:
            ft_len = int(round(spec["train_len"] * variant.factor))
            torch.manual_seed(spec["seed"] + ft_len)
            start = time.perf_counter()
            losses = train(model, data, spec, steps=variant.finetune_steps, lr=spec["finetune"]["lr"],
                           warmup=max(1, variant.finetune_steps // 10), seq_len=ft_len,
                           seed=spec["seed"] + 1 + ft_len, device=device, log=log,
                           tag=f"finetune {method} s={variant.factor:g} ")
            ft_loss, ft_s = losses[-1], time.perf_counter() - start
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
