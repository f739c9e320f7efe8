"""``attnbench context ...``: the context-extension stage's subcommands (listed in cli.COMMAND_MODULES).

  context pretrain       pretrain the tiny GPT at context.capability.train_len (run directory: the checkpoint's
                         path without .pt); write a checkpoint
  context evaluate       one RoPE method's variants (no fine-tune and fine-tuned, their runs under the output's
                         path without .parquet) scored at every length
  context rope-overhead  time the cos/sin tables and q/k rotation per method and length
  context merge          merge the capability parts and the cost parts (each into one parquet file)

The stage's tables and figure: ``attnbench tables context`` (:mod:`attnbench.report.context`).
"""
from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from attnbench.arguments import THREADS
from attnbench.errors import ConfigError
from attnbench.files import read_parquet


def _job(path: str, stages: tuple[str, ...], threads: int | None) -> dict:
    import torch

    from attnbench.plan import read_job

    if threads:
        torch.set_num_threads(threads)
    return read_job(path, stages)


def _cmd_pretrain(args) -> int:
    import torch

    from attnbench.context.experiment import pretrain

    job = _job(args.job, ("context-pretrain",), args.threads)
    spec, device = job["spec"], job["device"]
    print(f"attnbench context pretrain: {device}; L={spec['train_len']}, {spec['pretrain']['steps']} steps",
          file=sys.stderr)
    checkpoint = pretrain(spec, device, Path(args.out).with_suffix(""))  # the run directory beside the checkpoint
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(args.out).with_suffix(".tmp")
    torch.save(checkpoint, tmp)
    tmp.replace(args.out)
    print(f"wrote {args.out} ({checkpoint['params']} parameters, final loss {checkpoint['losses'][-1]:.4f}, "
          f"{checkpoint['train_s']:.1f} s)", file=sys.stderr)
    return 0


def _cmd_evaluate(args) -> int:
    from attnbench.bench.results import write_atomic
    from attnbench.context.experiment import CHECKPOINT_KEYS, evaluate
    from attnbench.train.checkpoint import load_checkpoint

    job = _job(args.job, ("context-evaluate",), args.threads)
    spec, device = job["spec"], job["device"]
    checkpoint = load_checkpoint(args.checkpoint, CHECKPOINT_KEYS)  # weights_only; a bad file is moved aside
    if checkpoint is None:
        raise ConfigError(f"checkpoint {args.checkpoint!r} does not exist; run `attnbench context pretrain` first")
    if checkpoint["spec"]["train_len"] != spec["train_len"] or checkpoint["spec"]["model"] != spec["model"]:
        raise ConfigError(f"context.capability: the checkpoint {args.checkpoint} was pretrained with another "
                          "train_len or model; rerun `attnbench context pretrain`")
    print(f"attnbench context evaluate: {device}; method {job['method']}", file=sys.stderr)
    df = pd.DataFrame(evaluate(checkpoint, spec, job["method"], device, Path(args.out).with_suffix("")))  # fine-tunes
    write_atomic(df, args.out)
    print(f"wrote {len(df)} rows to {args.out}", file=sys.stderr)
    return 0


def _cmd_rope_overhead(args) -> int:
    from attnbench.bench.results import write_atomic
    from attnbench.case import DTYPES
    from attnbench.context.cost import rope_overhead

    job = _job(args.job, ("context-rope",), args.threads)
    shape, device = job["shape"], job["device"]
    if shape is None:
        print("attnbench context rope-overhead: no fwd/fwd_bwd cases in context.cost; nothing to time", file=sys.stderr)
        rows = []
    else:
        print(f"attnbench context rope-overhead: {device}; lengths {shape['lengths']}", file=sys.stderr)
        rows = rope_overhead(shape["lengths"], heads_q=shape["heads_q"], heads_kv=shape["heads_kv"],
                             head_dim=shape["head_dim"], dtype=DTYPES[shape["dtype"]], device=device,
                             original_max_len=job["original_max_len"])
    write_atomic(pd.DataFrame(rows), args.out)
    print(f"wrote {len(rows)} rows to {args.out}", file=sys.stderr)
    return 0


def _cmd_merge(args) -> int:
    from attnbench.bench.results import write_atomic

    for parts, out in ((args.capability, args.out_capability), (args.cost, args.out_cost)):
        frame = pd.concat([read_parquet(p) for p in parts], ignore_index=True) if parts else pd.DataFrame()
        write_atomic(frame, out)
        print(f"wrote {len(frame)} rows from {len(parts)} files to {out}", file=sys.stderr)
    return 0


def add_commands(sub) -> None:
    parser = sub.add_parser("context", help="RoPE context extension: capability and cost experiments")
    ctx = parser.add_subparsers(dest="context_command", required=True)

    p = ctx.add_parser("pretrain", help="pretrain the tiny GPT at context.capability.train_len")
    p.add_argument("--job", required=True, help="its plan file, results/<sweep>/plan/context/capability-pretrain.json")
    p.add_argument("--out", required=True, help="checkpoint (.pt)")
    p.add_argument("--threads", type=THREADS, help="torch CPU threads (default: torch's)")
    p.set_defaults(func=_cmd_pretrain)

    p = ctx.add_parser("evaluate", help="score one method's variants at every evaluation length")
    p.add_argument("--job", required=True, help="its plan file, results/<sweep>/plan/context/capability-<method>.json")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--threads", type=THREADS, help="torch CPU threads (default: torch's)")
    p.set_defaults(func=_cmd_evaluate)

    p = ctx.add_parser("rope-overhead", help="time RoPE tables and rotation per method at the cost lengths")
    p.add_argument("--job", required=True, help="its plan file, results/<sweep>/plan/context/rope-overhead.json")
    p.add_argument("--out", required=True)
    p.add_argument("--threads", type=THREADS, help="torch CPU threads (default: torch's)")
    p.set_defaults(func=_cmd_rope_overhead)

    p = ctx.add_parser("merge", help="merge the capability parts and the cost parts")
    p.add_argument("--capability", nargs="*", default=[], help="capability parts (parquet)")
    p.add_argument("--cost", nargs="*", default=[], help="cost parts (parquet)")
    p.add_argument("--out-capability", required=True)
    p.add_argument("--out-cost", required=True)
    p.set_defaults(func=_cmd_merge)
