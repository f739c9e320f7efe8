"""One pretraining run: per-step log, checkpoints that resume exactly, and a run summary.

A run directory holds ``run.json`` (the resolved config and its hash), ``ckpt.pt``
(model, optimiser, loss scaler, step and the log so far; written atomically every
``ckpt_every`` steps), ``snapshots/<step>.pt`` (fp32 weights at the requested steps,
for weight divergence), then ``steps.parquet``, ``fp8_layers.parquet`` (with
``fp8_stats``), ``final.pt`` and ``summary.json`` when it ends. A run whose summary
exists with the same identity hash is not run again; a killed run resumes from its last
checkpoint. The initial weights are a pure function of ``init_seed`` (or the
``init_state`` a caller passes, e.g. pretrained weights to fine-tune), the data order of
(``data_seed``, step), and the model has no dropout, so a resumed run repeats the
uninterrupted trajectory. The identity hash (``config_hash`` in the summary) covers the
run's config, its data source's name and hash, and the initial weights' hash when given.

The one training loop of the project: the pretraining experiments
(:mod:`attnbench.train.experiments`) and the context stage's pretraining and fine-tuning
(:mod:`attnbench.context.experiment`, with its passkey mixture as the data source) call
:func:`train`.

Per step (``steps.parquet``): loss (cross-entropy), z-loss term, grad norm (before
clipping), update RMS (root mean square of the parameter change the optimiser made),
LR, output log Z (mean and max over tokens of logsumexp of the logits), max
attention logit per layer (a probe every ``probe_every`` steps), tokens/s, step
time, energy (NVML's energy counter around the timed step on CUDA; NaN elsewhere;
``tokens_per_j`` in the summary), memory, non-finite and skipped flags, the fp16
loss scale, FP8 scale statistics summed over layers (every ``fp8_stats_every``
steps; per layer in ``fp8_layers.parquet``) and validation loss (every
``eval_every`` steps, at the last step, and where a time budget cuts the run). Beside the
timed step, the wall time of the work around it where a step does it: building the batch
(``data_s``, every step), the max-logit probe (``probe_s``), the FP8 statistics' extra forward
and backward (``fp8_stats_s``), the validation (``val_s``) and the checkpoint written after the
step (``ckpt_s``; the row a resumed run restarted from lacks it, as the checkpoint holds that
row as it was before its own save was timed), so a run's wall time can be accounted for. The
compile falls in the first timed step after each start or resume.

Loss: cross-entropy plus ``z_loss * mean(log Z ** 2)`` (PaLM, Chowdhery et al. 2022
§5; Wortsman et al. 2023 use 1e-4). A step whose loss or gradient is not finite
makes no update and is counted; ``max_nonfinite`` in a row ends the run as
``diverged``, so a sweep goes on.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from attnbench.bench.provenance import environment, timestamp
from attnbench.bench.telemetry import Telemetry
from attnbench.bench.results import write_atomic
from attnbench.errors import ConfigError
from attnbench.errors import reject_unknown_keys
from attnbench.models.gpt import GPT, GPTConfig
from attnbench.train import stability
from attnbench.train.attention_backend import (BackendUnavailable, BackendUnsupported, check_backend,
                                               fastest_backend)
from attnbench.train.checkpoint import resume_checkpoint
from attnbench.train.data import BatchSource, DataConfig, load_tokens
from attnbench.train.determinism import deterministic_algorithms
from attnbench.train.sharing import GpuSharing
from attnbench.train.precision import (PRECISIONS, Fp8StatsRecorder, PrecisionUnavailable, apply_precision,
                                       get_precision)

CHECKPOINT_KEYS = ("step", "config_hash", "backend", "model", "opt", "scaler", "rows", "counters")  # Run.state


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 100
    batch_size: int = 8
    seq_len: int = 64
    lr: float = 3e-3
    min_lr_ratio: float = 0.1       # cosine decay ends at lr * min_lr_ratio
    warmup_steps: int = 10
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0          # 0: no clipping (the norm is still logged)
    z_loss: float = 0.0
    precision: str = "fp32"
    init_seed: int = 0              # the initial weights (torch.manual_seed before the model is built)
    data_seed: int = 0              # the batch order (attnbench.train.data)
    eval_every: int = 50
    eval_batches: int = 4
    probe_every: int = 1            # max attention logit probe; 0: off
    fp8_stats: tuple[str, ...] = ()  # recipes whose scale statistics are logged (attnbench.train.precision)
    fp8_stats_every: int = 10
    fp8_stats_layers: bool = True   # also per layer, in fp8_layers.parquet
    ckpt_every: int = 50
    snapshot_steps: tuple[int, ...] = ()  # updates after which fp32 weights are saved (0 = at init)
    compile: bool = False
    deterministic: bool = False     # PyTorch's deterministic algorithms (attnbench.train.determinism)
    max_nonfinite: int = 20         # consecutive non-finite steps that end the run as diverged
    backend_candidates: tuple[str, ...] = ("sdpa-math", "sdpa-flash", "eager")  # for model.backend: auto

    def __post_init__(self):
        if self.precision not in PRECISIONS:
            raise ConfigError(f"train.precision={self.precision!r} is not allowed; allowed: {', '.join(PRECISIONS)}")
        for key in ("steps", "batch_size", "seq_len", "eval_batches", "max_nonfinite"):
            if getattr(self, key) < 1:
                raise ConfigError(f"train.{key}={getattr(self, key)!r} is not allowed; allowed: a positive integer")
        if not self.lr > 0:
            raise ConfigError(f"train.lr={self.lr!r} is not allowed; allowed: a positive number")
        if self.warmup_steps > self.steps:  # the LR would never reach train.lr: the run's label would be wrong
            raise ConfigError(f"train.warmup_steps={self.warmup_steps} is longer than train.steps={self.steps}; "
                              "allowed: at most train.steps warm-up steps")

    @classmethod
    def from_dict(cls, values: dict) -> "TrainConfig":
        reject_unknown_keys(values, [f.name for f in dataclasses.fields(cls)], "train", ConfigError)
        values = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
        return cls(**values)


@dataclass(frozen=True)
class RunSpec:
    """What one run trains: a name, the three configs, and tags that label it in tables."""

    name: str
    model: GPTConfig
    train: TrainConfig
    data: DataConfig = field(default_factory=DataConfig)
    tags: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"name": self.name, "model": self.model.to_dict(), "train": dataclasses.asdict(self.train),
                "data": dataclasses.asdict(self.data), "tags": self.tags}

    @classmethod
    def from_dict(cls, values: dict) -> "RunSpec":
        """The inverse of :meth:`to_dict` (a job's plan file holds its runs this way)."""
        reject_unknown_keys(values, ("name", "model", "train", "data", "tags"), "run")
        return cls(values["name"], GPTConfig.from_dict(values["model"]), TrainConfig.from_dict(values["train"]),
                   DataConfig.from_dict(values["data"]), dict(values["tags"]))

    @property
    def config_hash(self) -> str:
        payload = {k: v for k, v in self.to_dict().items() if k not in ("name", "tags")}
        if not self.train.deterministic:  # in the hash only when on: runs made before the switch keep their identity
            del payload["train"]["deterministic"]
        return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up over ``warmup_steps``, then cosine decay to ``lr * min_lr_ratio`` at the last step."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    span = max(1, cfg.steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(cross-entropy, log Z per token): both from fp32 logits."""
    logits = logits.float()
    log_z = torch.logsumexp(logits, dim=-1)  # (B, S)
    ce = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
    return ce, log_z


class Progress:
    """A one-line progress bar on stderr for runs of ``min_steps`` or more (a line per 10% when not a TTY)."""

    def __init__(self, name: str, total: int, start: int, enabled: bool, min_steps: int = 200):
        self.name, self.total, self.enabled = name, total, enabled and total >= min_steps
        self.tty = sys.stderr.isatty()
        self.last_decile = start * 10 // max(total, 1)

    def update(self, step: int, loss: float, tokens_per_s: float) -> None:
        if not self.enabled:
            return
        done = step + 1
        filled = 30 * done // self.total
        text = (f"{self.name} [{'#' * filled}{'.' * (30 - filled)}] {done}/{self.total} "
                f"loss {loss:.3f} {tokens_per_s / 1e3:.1f}k tok/s")
        decile = done * 10 // self.total
        if self.tty:
            print("\r" + text, end="\n" if done == self.total else "", file=sys.stderr, flush=True)
        elif decile > self.last_decile:
            print(text, file=sys.stderr, flush=True)
        self.last_decile = decile


def _memory_bytes(device: str) -> float:
    if device == "cuda":
        peak = torch.cuda.max_memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        return float(peak)
    try:  # resident set size of this process (Linux)
        with open("/proc/self/statm") as fh:
            return float(int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE"))
    except (OSError, ValueError, IndexError):
        return math.nan


def _atomic_save(obj, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def write_json(obj, path: Path) -> None:
    """``obj`` as JSON at ``path``, written whole or not at all (a temporary file, then a rename); NaN kept."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str, allow_nan=True))
    os.replace(tmp, path)


def _param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]


@torch.no_grad()
def evaluate(model, batches, precision, device) -> float:
    model.eval()
    losses = []
    for x, y in batches:
        with precision.autocast(device):
            losses.append(lm_loss(model(x), y)[0])
    model.train()
    return float(np.mean(torch.stack(losses).tolist()))  # one device sync, not one a batch


def _resolve_backend(spec: RunSpec, device: str, dtype: torch.dtype) -> tuple[GPTConfig, dict]:
    """model.backend ``auto`` -> the fastest of ``train.backend_candidates`` at this run's attention shape."""
    if spec.model.backend != "auto":
        return spec.model, {}
    with torch.device("meta"):
        probe = GPT(dataclasses.replace(spec.model, backend="sdpa-math"))
    case = probe.blocks[0].attn.case(spec.train.batch_size, spec.train.seq_len, _dtype_name(dtype))
    name, times = fastest_backend(case, device, dtype, list(spec.train.backend_candidates))
    return dataclasses.replace(spec.model, backend=name), {f"auto_ms_{k}": v * 1e3 for k, v in times.items()}


def _dtype_name(dtype: torch.dtype) -> str:
    return {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]


def _tensors_sha256(state: dict[str, torch.Tensor]) -> str:
    """SHA-256 of a state dict's keys, dtypes, shapes and values (the initial weights' part of a run's identity)."""
    h = hashlib.sha256()
    for key in sorted(state):
        t = state[key].detach().cpu().contiguous()
        h.update(f"{key}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def run_identity(spec: RunSpec, data: BatchSource | None, init_sha256: str | None) -> str:
    """The hash a finished run and a checkpoint are matched by: the spec's, else with the data source and weights."""
    if data is None and init_sha256 is None:
        return spec.config_hash
    payload = {"spec": spec.config_hash, "data": [data.name, data.sha256] if data is not None else None,
               "init": init_sha256}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


class Run:
    """State of one run while it trains (built by :func:`train`)."""

    def __init__(self, spec: RunSpec, out: Path, device: str, identity: str):
        self.spec, self.out, self.device, self.identity = spec, out, device, identity
        self.cfg = spec.train
        self.precision = get_precision(self.cfg.precision)
        self.compute_dtype = self.precision.autocast_dtype or torch.float32
        self.telemetry = Telemetry.open(device, interval_ms=0)  # the energy counter only

    def build(self, backend: str | None = None, init_state: dict | None = None) -> None:
        """``backend``: the one a resumed run chose before (``auto`` must not switch kernels mid-run);
        ``init_state``: weights to start from instead of ``init_seed``'s initialisation."""
        torch.manual_seed(self.cfg.init_seed)
        if backend:
            self.model_cfg, self.auto_times = dataclasses.replace(self.spec.model, backend=backend), {}
        else:
            self.model_cfg, self.auto_times = _resolve_backend(self.spec, self.device, self.compute_dtype)
        torch.manual_seed(self.cfg.init_seed)
        self.model = GPT(self.model_cfg).to(self.device)
        if init_state is not None:
            self.model.load_state_dict(init_state)
        self.params = self.model.num_params()
        self.flops_per_token = self.model.flops_per_token(self.cfg.seq_len)
        self.kv_elements = self.model.kv_cache_elements_per_token()
        case = self.model.blocks[0].attn.case(self.cfg.batch_size, self.cfg.seq_len, _dtype_name(self.compute_dtype))
        check_backend(self.model_cfg.backend, case, self.device, self.compute_dtype)
        self.emulated, self.precision_note = apply_precision(self.model, self.precision, self.device)
        self.opt = torch.optim.AdamW(_param_groups(self.model, self.cfg.weight_decay), lr=self.cfg.lr,
                                     betas=(self.cfg.beta1, self.cfg.beta2))
        self.scaler = torch.amp.GradScaler(self.device) if self.precision.loss_scaling else None
        self.forward = torch.compile(self.model) if self.cfg.compile else self.model
        self.recorder = Fp8StatsRecorder(self.model, self.cfg.fp8_stats) if self.cfg.fp8_stats else None

    def state(self, step: int, log: dict, counters: dict) -> dict:
        return {"step": step, "config_hash": self.identity, "backend": self.model_cfg.backend,
                "model": self.model.state_dict(),
                "opt": self.opt.state_dict(), "scaler": self.scaler.state_dict() if self.scaler else None,
                "rows": log["rows"], "layer_rows": log["layer_rows"], "counters": counters}

    def load(self, ckpt: dict) -> None:
        self.model.load_state_dict(ckpt["model"])
        self.opt.load_state_dict(ckpt["opt"])
        if self.scaler and ckpt["scaler"]:
            self.scaler.load_state_dict(ckpt["scaler"])

    def weights(self) -> dict[str, torch.Tensor]:
        """The model's distinct tensors as fp32 CPU copies (the tied output head once, as ``wte.weight``)."""
        seen, out = set(), {}
        for key, value in self.model.state_dict().items():
            if value.data_ptr() in seen:
                continue
            seen.add(value.data_ptr())
            out[key] = value.detach().float().cpu()
        return out

    def snapshot(self, updates: int) -> None:
        if updates in self.cfg.snapshot_steps:
            (self.out / "snapshots").mkdir(exist_ok=True)
            _atomic_save(self.weights(), self.out / "snapshots" / f"{updates}.pt")

    def step(self, step: int, data: BatchSource, layer_rows: list) -> dict:
        cfg, device, model = self.cfg, self.device, self.model
        lr = lr_at(step, cfg)
        for group in self.opt.param_groups:
            group["lr"] = lr
        began = time.perf_counter()
        x, y = data.train_batch(step, cfg.data_seed, cfg.batch_size, cfg.seq_len, device)
        row = {"step": step, "lr": lr, "data_s": time.perf_counter() - began}
        if cfg.probe_every and step % cfg.probe_every == 0:
            began = time.perf_counter()
            with self.precision.autocast(device):
                for i, value in enumerate(model.max_attention_logits(x)):  # synced: the values are floats
                    row[f"max_logit_l{i}"] = value
            row["probe_s"] = time.perf_counter() - began
        stats = self.recorder and cfg.fp8_stats_every and step % cfg.fp8_stats_every == 0
        began = time.perf_counter()
        if stats:
            with self.recorder.recording(), self.precision.autocast(device):
                lm_loss(model(x), y)[0].backward()
            self.opt.zero_grad(set_to_none=True)
            row.update(self.recorder.row())
            if cfg.fp8_stats_layers:
                layer_rows += self.recorder.layer_rows(step)
        if device == "cuda":
            torch.cuda.synchronize()  # the timed step starts on an idle device; the statistics' work ends here
        if stats:
            row["fp8_stats_s"] = time.perf_counter() - began
        energy_mj = self.telemetry.energy_mj()
        start = time.perf_counter()
        with self.precision.autocast(device):
            logits = self.forward(x)
        ce, log_z = lm_loss(logits, y)
        z_term = log_z.square().mean()
        loss = ce + cfg.z_loss * z_term if cfg.z_loss else ce
        (self.scaler.scale(loss) if self.scaler else loss).backward()
        if self.scaler:
            self.scaler.unscale_(self.opt)
        params = [p for p in model.parameters() if p.grad is not None]
        grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip if cfg.grad_clip > 0 else math.inf)
        weights = [p.detach() for p in params]
        before = torch._foreach_mul(weights, 1.0)  # one multi-tensor copy, not a kernel per parameter
        finite = torch.isfinite(ce) & torch.isfinite(grad_norm)
        if self.scaler:  # the scaler skips the update itself when it found inf/NaN gradients
            scale = self.scaler.get_scale()
            self.scaler.step(self.opt)
            self.scaler.update()
        elif bool(finite):
            self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        update_sq = torch.stack(torch._foreach_norm(torch._foreach_sub(weights, before))).square().sum()
        values = torch.stack([ce.detach(), z_term.detach(), log_z.detach().mean(), log_z.detach().max(),
                              grad_norm.detach().float(), update_sq.float()]).tolist()  # one device sync
        elapsed = time.perf_counter() - start
        n_params = sum(p.numel() for p in params)
        row.update({"loss": values[0], "z_loss_term": values[1], "logz_mean": values[2], "logz_max": values[3],
                    "grad_norm": values[4], "update_rms": math.sqrt(values[5] / n_params),
                    "step_s": elapsed, "tokens_per_s": cfg.batch_size * cfg.seq_len / elapsed,
                    "energy_j": (self.telemetry.energy_mj() - energy_mj) / 1e3,
                    "memory_bytes": _memory_bytes(device),
                    "nonfinite": not (math.isfinite(values[0]) and (self.scaler is not None or math.isfinite(values[4]))),
                    "skipped": values[5] == 0.0, "loss_scale": scale if self.scaler else math.nan})
        return row


def train(spec: RunSpec, out_dir: str | Path, device: str = "cpu", *, peak_flops: float | None = None,
          peak_flops_source: str = "", progress: bool = True, deadline: float | None = None,
          data: BatchSource | None = None, init_state: dict[str, torch.Tensor] | None = None,
          again: bool = False) -> dict:
    """Train ``spec`` into ``out_dir`` (resuming if a checkpoint is there); return the summary.

    ``deadline`` (a ``time.monotonic()`` value) ends the run early with status
    ``truncated`` and a full summary of the steps done, for time-boxed sweeps.
    ``peak_flops`` is the measured matmul ceiling for this precision (MFU is NaN without it),
    ``peak_flops_source`` says where it was measured. ``data`` replaces the batches of
    ``spec.data`` (any :class:`~attnbench.train.data.BatchSource`); ``init_state`` is a state
    dict the model starts from instead of ``init_seed``'s initialisation (a fine-tune). ``again``
    trains from step 0 even where a summary or checkpoint of this config is there (a run whose
    weight snapshots were left behind on another machine). With ``train.deterministic`` the run trains under
    PyTorch's deterministic algorithms (:mod:`attnbench.train.determinism`; the process must have called
    :func:`~attnbench.train.determinism.prepare_process` before its first CUDA work).
    """
    with deterministic_algorithms(spec.train.deterministic):
        return _train(spec, Path(out_dir), device, peak_flops, peak_flops_source, progress, deadline, data,
                      init_state, again)


def _train(spec: RunSpec, out: Path, device: str, peak_flops: float | None, peak_flops_source: str, progress: bool,
           deadline: float | None, data: BatchSource | None, init_state: dict[str, torch.Tensor] | None,
           again: bool) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    summary_path = out / "summary.json"
    init_sha = _tensors_sha256(init_state) if init_state is not None else None
    identity = run_identity(spec, data, init_sha)
    if summary_path.is_file():
        done = json.loads(summary_path.read_text())
        if done.get("config_hash") == identity and done.get("status") != "truncated" and not again:
            return done
    write_json({**spec.to_dict(), "config_hash": identity, "init_sha256": init_sha}, out / "run.json")
    started = time.perf_counter()
    run = Run(spec, out, device, identity)
    data = data if data is not None else load_tokens(spec.data)
    base = {"run": spec.name, **spec.tags, "config_hash": identity, "corpus": data.name,
            "corpus_sha256": data.sha256, "precision": spec.train.precision, "init_seed": spec.train.init_seed,
            "data_seed": spec.train.data_seed, "lr": spec.train.lr, "layout": spec.model.layout,
            "mlp": spec.model.mlp, "smooth_swiglu": spec.model.smooth_swiglu, "qk_norm": spec.model.qk_norm,
            "z_loss": spec.train.z_loss, "compile": spec.train.compile, "deterministic": spec.train.deterministic,
            "steps": spec.train.steps, "init_sha256": init_sha or ""}
    ckpt_path = out / "ckpt.pt"
    ckpt = resume_checkpoint(ckpt_path, CHECKPOINT_KEYS, map_location=device)  # weights_only; a bad one: start over
    if ckpt is not None and (ckpt.get("config_hash") != identity or again):
        ckpt = None  # a checkpoint of another config: start over
    try:
        run.build(ckpt["backend"] if ckpt else None, init_state if ckpt is None else None)
    except (PrecisionUnavailable, BackendUnsupported) as err:
        status = "unavailable" if isinstance(err, (PrecisionUnavailable, BackendUnavailable)) else "unsupported"
        summary = {**base, "backend": spec.model.backend, "status": status, "reason": str(err),
                   **_provenance(device)}
        write_json(summary, summary_path)
        return summary
    sharing = GpuSharing(device)
    sharing.sample()
    val = data.val_batches(spec.train.eval_batches, spec.train.batch_size, spec.train.seq_len, device)
    log, counters, start = {"rows": [], "layer_rows": []}, {"initial_val_loss": math.nan, "consecutive_nonfinite": 0}, 0
    if ckpt is not None:
        run.load(ckpt)
        log, counters, start = {"rows": ckpt["rows"], "layer_rows": ckpt.get("layer_rows", [])}, ckpt["counters"], \
            ckpt["step"]
        sharing.resume(counters.pop("gpu_sharing", {}))  # its earlier parts' GPU, with the rows they logged
        del ckpt

    def checkpoint(step: int) -> None:  # the run so far, with what its GPU sharing was
        _atomic_save(run.state(step, log, {**counters, "gpu_sharing": sharing.record()}), ckpt_path)

    if start == 0:
        counters["initial_val_loss"] = evaluate(run.model, val, run.precision, device)
        run.snapshot(0)
    bar = Progress(spec.name, spec.train.steps, start, progress)
    status, reason = "ok", ""
    rows = log["rows"]
    for step in range(start, spec.train.steps):
        row = run.step(step, data, log["layer_rows"])
        counters["consecutive_nonfinite"] = counters["consecutive_nonfinite"] + 1 if row["nonfinite"] else 0
        updates = step + 1
        out_of_time = deadline is not None and time.monotonic() > deadline and updates < spec.train.steps
        if updates % spec.train.eval_every == 0 or updates == spec.train.steps or out_of_time:
            began = time.perf_counter()
            row["val_loss"] = evaluate(run.model, val, run.precision, device)
            row["val_s"] = time.perf_counter() - began
            sharing.sample()
        rows.append(row)
        run.snapshot(updates)
        bar.update(step, row["loss"], row["tokens_per_s"])
        if counters["consecutive_nonfinite"] >= spec.train.max_nonfinite:
            status, reason = "diverged", f"{spec.train.max_nonfinite} consecutive non-finite steps at step {step}"
            break
        if out_of_time:
            status, reason = "truncated", f"time budget reached after {updates} of {spec.train.steps} steps"
            break
        if spec.train.ckpt_every and updates % spec.train.ckpt_every == 0 and updates < spec.train.steps:
            began = time.perf_counter()
            checkpoint(updates)
            row["ckpt_s"] = time.perf_counter() - began  # after the save: the checkpoint's own copy of the row lacks it
    sharing.sample()
    frame = pd.DataFrame(rows)
    frame.insert(0, "run", spec.name)
    write_atomic(frame, out / "steps.parquet")
    if log["layer_rows"]:
        layers = pd.DataFrame(log["layer_rows"])
        layers.insert(0, "run", spec.name)
        write_atomic(layers, out / "fp8_layers.parquet")
    summary = {**base, "backend": run.model_cfg.backend, "status": status, "reason": reason or run.precision_note,
               "emulated": run.emulated, "params": run.params, "flops_per_token": run.flops_per_token,
               "kv_cache_elements_per_token": run.kv_elements, "kv_bytes_per_token_bf16": 2 * run.kv_elements,
               "initial_val_loss": counters["initial_val_loss"], "loss_floor": data.loss_floor,
               **summarize(frame, run.flops_per_token, peak_flops, run.emulated),
               "peak_flops_source": peak_flops_source, **sharing.summary(), **run.auto_times,
               "wall_s": time.perf_counter() - started, **_provenance(device)}
    write_json(summary, summary_path)
    _atomic_save({k: v.detach().cpu() for k, v in run.model.state_dict().items()}, out / "final.pt")  # loadable
    if status == "truncated":  # a later call with more time resumes here
        checkpoint(rows[-1]["step"] + 1)
    elif ckpt_path.is_file():
        ckpt_path.unlink()
    if run.recorder:
        run.recorder.remove()
    return summary


def _provenance(device: str) -> dict:
    env = environment(device)
    return {k: env[k] for k in ("device", "device_name", "torch_version", "cuda_version", "git_sha", "host", "gpu")} | {
        "timestamp": timestamp()}


def warm_steps(frame: pd.DataFrame) -> pd.DataFrame:
    """The steps after the first 10% (warm-up, compilation left out)."""
    n = len(frame)
    return frame.iloc[max(1, n // 10):] if n > 1 else frame


def speed_stats(frame: pd.DataFrame) -> dict:
    """Median and interquartile range of the per-step tokens/s after the first 10% of steps.

    The first tenth is left out (warm-up, compilation). The IQR is reported beside the median as
    ``torch.utils.benchmark.Measurement`` does: a step of a few ms drifts within a run, and an IQR
    that is a large share of the median says that one run's speed is not a stable number.
    """
    warm = warm_steps(frame)["tokens_per_s"]
    q25, q50, q75 = (float(v) for v in warm.quantile([0.25, 0.5, 0.75]))  # NaN without steps
    return {"tokens_per_s": q50, "tokens_per_s_iqr": q75 - q25}


def tokens_per_joule(frame: pd.DataFrame) -> float:
    """Tokens over the energy of the same steps, after the first 10% (the counter's 20-100 ms updates
    average out over many steps); NaN without energy readings (CPU, or no NVML)."""
    warm = warm_steps(frame)
    if "energy_j" not in warm or not warm["energy_j"].notna().any():
        return math.nan
    measured = warm.dropna(subset=["energy_j"])
    energy = float(measured["energy_j"].sum())
    return float((measured["tokens_per_s"] * measured["step_s"]).sum()) / energy if energy > 0 else math.nan


def summarize(frame: pd.DataFrame, flops_per_token: float, peak_flops: float | None, emulated: bool) -> dict:
    """Per-run statistics from the step log: both spike scores with their windows
    (:func:`attnbench.train.stability.spike_summary`), z-score exceedances, losses, speed.

    MFU = tokens/s x training FLOPs per token / the measured matmul ceiling of the
    run's compute dtype (PaLM Appendix B). Emulated precisions claim no speed: their
    tokens/s and MFU are NaN.
    """
    n = len(frame)
    loss, grad = frame["loss"].to_numpy(float), frame["grad_norm"].to_numpy(float)
    val = frame["val_loss"].dropna() if "val_loss" in frame else pd.Series(dtype=float)
    logit_cols = [c for c in frame.columns if c.startswith("max_logit_l")]
    out = {
        "steps_done": n,
        "final_loss": float(frame["loss"].iloc[-max(1, n // 10):].mean()),  # NaN when every step is non-finite
        "final_val_loss": float(val.iloc[-1]) if len(val) else math.nan,
        "best_val_loss": float(val.min()) if len(val) else math.nan,
        **stability.spike_summary(loss, grad),
        "zscore_window": stability.ZSCORE_WINDOW, "zscore_threshold": stability.ZSCORE_THRESHOLD,
        "zscore_exceed_loss": stability.zscore_exceedances(loss),
        "zscore_exceed_grad": stability.zscore_exceedances(grad),
        "nonfinite_steps": int(frame["nonfinite"].sum()) if n else 0,
        "skipped_steps": int(frame["skipped"].sum()) if n else 0,
        "max_attention_logit": float(frame[logit_cols].max().max()) if logit_cols else math.nan,
        "final_logz_mean": float(frame["logz_mean"].iloc[-1]) if n else math.nan,
        "peak_memory_bytes": float(frame["memory_bytes"].max()) if n else math.nan,
        **({key: math.nan for key in ("tokens_per_s", "tokens_per_s_iqr")} if emulated else speed_stats(frame)),
        "tokens_per_j": math.nan if emulated else tokens_per_joule(frame),
        "peak_flops": peak_flops if peak_flops else math.nan,
    }
    out["mfu"] = out["tokens_per_s"] * flops_per_token / peak_flops if peak_flops else math.nan
    return out
