"""``attnbench context ...``: the context-extension stage's subcommands (listed in cli.COMMAND_MODULES).

  context pretrain       pretrain the tiny GPT at context.capability.train_len; write a checkpoint
  context evaluate       one RoPE method's variants (no fine-tune and fine-tuned) scored at every length
  context cost           one group of context.cost.<device> through the microbench harness
  context rope-overhead  time the cos/sin tables and q/k rotation per method and length
  context tables         merge the parts; write PI- and YaRN-style tables, passkey and cost tables
"""
from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd


def _load(path: str, threads: int | None = None) -> tuple[dict, str, str]:
    import torch

    from attnbench.config import load_config, resolve_device

    if threads:
        torch.set_num_threads(threads)
    config = load_config(path)
    device, why = resolve_device(config)
    return config, device, why


def _cmd_pretrain(args) -> int:
    import torch

    from attnbench.context.experiment import capability_spec, pretrain

    config, device, why = _load(args.config, args.threads)
    spec = capability_spec(config["context"], device)
    print(f"attnbench context pretrain: {device} ({why}); L={spec['train_len']}, {spec['pretrain']['steps']} steps",
          file=sys.stderr)
    checkpoint = pretrain(spec, device)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(args.out).with_suffix(".tmp")
    torch.save(checkpoint, tmp)
    tmp.replace(args.out)
    print(f"wrote {args.out} ({checkpoint['params']} parameters, final loss {checkpoint['losses'][-1]:.4f}, "
          f"{checkpoint['train_s']:.1f} s)", file=sys.stderr)
    return 0


def _cmd_evaluate(args) -> int:
    import torch

    from attnbench.bench.results import write_atomic
    from attnbench.config import ConfigError
    from attnbench.context.experiment import capability_spec, evaluate

    config, device, why = _load(args.config, args.threads)
    spec = capability_spec(config["context"], device)
    checkpoint = torch.load(args.checkpoint, map_location="cpu", weights_only=False)
    if checkpoint["spec"]["train_len"] != spec["train_len"] or checkpoint["spec"]["model"] != spec["model"]:
        raise ConfigError(f"context.capability: the checkpoint {args.checkpoint} was pretrained with another "
                          "train_len or model; rerun `attnbench context pretrain`")
    print(f"attnbench context evaluate: {device} ({why}); method {args.method}", file=sys.stderr)
    df = pd.DataFrame(evaluate(checkpoint, spec, args.method, device))
    write_atomic(df, args.out)
    print(f"wrote {len(df)} rows to {args.out}", file=sys.stderr)
    return 0


def _cmd_cost(args) -> int:
    from attnbench.bench.ceilings import Ceilings, measure_ceilings
    from attnbench.bench.microbench import RunOptions
    from attnbench.bench.results import to_frame, write_atomic
    from attnbench.config import ConfigError
    from attnbench.context.cost import cost_plan, run_cost
    from attnbench.kernels.registry import get_backend

    config, device, why = _load(args.config, args.threads)
    plan = cost_plan(config["context"], device)
    for name in args.backend or []:
        get_backend(name)
    if args.group and args.group not in plan.groups:
        raise ConfigError(f"group={args.group!r} is not in context.cost.{device}.groups; "
                          f"allowed: {', '.join(plan.groups)}")
    groups = [args.group] if args.group else list(plan.groups)
    ceilings = Ceilings.load(args.ceilings) if args.ceilings else measure_ceilings(device)
    timing = config["timing"]
    rows = []
    for group in groups:
        print(f"attnbench context cost: {device} ({why}); group {group}", file=sys.stderr)
        options = RunOptions(sweep=config["sweep"], device=device, seed=config["seed"], warmup_ms=timing["warmup_ms"],
                             rep_ms=timing["rep_ms"], cpu_min_run_time_s=timing["cpu_min_run_time_s"],
                             ceilings=ceilings)
        rows += run_cost(plan, group, options, args.backend)
    write_atomic(to_frame(rows), args.out)
    print(f"wrote {len(rows)} rows to {args.out}", file=sys.stderr)
    return 0


def _cmd_rope_overhead(args) -> int:
    from attnbench.bench.case import DTYPES
    from attnbench.bench.results import write_atomic
    from attnbench.context.cost import cost_plan, rope_overhead
    from attnbench.context.experiment import capability_spec

    config, device, why = _load(args.config, args.threads)
    plan = cost_plan(config["context"], device)
    cases = [c for cases in plan.groups.values() for c in cases if c.mode != "decode"]
    if not cases:
        print("attnbench context rope-overhead: no fwd/fwd_bwd cases in context.cost; nothing to time", file=sys.stderr)
        rows = []
    else:
        first = cases[0]
        lengths = sorted({c.seq_q for c in cases})
        print(f"attnbench context rope-overhead: {device} ({why}); lengths {lengths}", file=sys.stderr)
        rows = rope_overhead(lengths, heads_q=first.heads_q, heads_kv=first.heads_kv, head_dim=first.head_dim_qk,
                             dtype=DTYPES[first.dtype], device=device,
                             original_max_len=capability_spec(config["context"], device)["train_len"])
    write_atomic(pd.DataFrame(rows), args.out)
    print(f"wrote {len(rows)} rows to {args.out}", file=sys.stderr)
    return 0


def _cmd_tables(args) -> int:
    from attnbench.bench.results import write_atomic
    from attnbench.context import tables

    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    if args.capability:
        cap = pd.concat([pd.read_parquet(p) for p in args.capability], ignore_index=True)
        write_atomic(cap, out / "capability.parquet")
        ok = cap[cap["status"] == "ok"]
        for name, table in (("perplexity_sliding", tables.perplexity_table(ok, "sliding")),
                            ("perplexity_truncated", tables.perplexity_table(ok, "truncated"))):
            (out / f"{name}.md").write_text(tables.to_markdown(table) + "\n")
        passkey = tables.to_markdown(tables.passkey_table(ok)) if (ok["eval"] == "passkey").any() else \
            "No passkey rows: context.capability.passkey.enabled is false for this device."
        (out / "passkey.md").write_text(passkey + "\n")
        written += ["perplexity_sliding.md", "perplexity_truncated.md", "passkey.md"]
    if args.cost:
        cost = pd.concat([pd.read_parquet(p) for p in args.cost], ignore_index=True)
        write_atomic(cost, out / "cost.parquet")
        (out / "cost.md").write_text(tables.to_markdown(tables.cost_table(cost)) + "\n")
        written.append("cost.md")
    if args.rope_overhead:
        rope = pd.read_parquet(args.rope_overhead)
        (out / "rope_overhead.md").write_text(tables.to_markdown(tables.rope_overhead_table(rope), ".3f") + "\n")
        written.append("rope_overhead.md")
    print(f"wrote {', '.join(written)} to {out}", file=sys.stderr)
    return 0


def add_commands(sub) -> None:
    from attnbench.models.rope import METHODS

    parser = sub.add_parser("context", help="RoPE context extension: capability and cost experiments")
    ctx = parser.add_subparsers(dest="context_command", required=True)

    p = ctx.add_parser("pretrain", help="pretrain the tiny GPT at context.capability.train_len")
    p.add_argument("--config", required=True)
    p.add_argument("--out", required=True, help="checkpoint (.pt)")
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    p.set_defaults(func=_cmd_pretrain)

    p = ctx.add_parser("evaluate", help="score one method's variants at every evaluation length")
    p.add_argument("--config", required=True)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--method", required=True, choices=METHODS)
    p.add_argument("--out", required=True)
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    p.set_defaults(func=_cmd_evaluate)

    p = ctx.add_parser("cost", help="microbench a context.cost group at extended lengths")
    p.add_argument("--config", required=True)
    p.add_argument("--group", help="one group of context.cost.<device>.groups; default: all")
    p.add_argument("--backend", action="append", help="backend name (repeatable); default: the group's list")
    p.add_argument("--ceilings", help="ceilings JSON from `attnbench ceilings`; default: measure now")
    p.add_argument("--out", required=True)
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    p.set_defaults(func=_cmd_cost)

    p = ctx.add_parser("rope-overhead", help="time RoPE tables and rotation per method at the cost lengths")
    p.add_argument("--config", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    p.set_defaults(func=_cmd_rope_overhead)

    p = ctx.add_parser("tables", help="merge the parts and write markdown tables")
    p.add_argument("--capability", nargs="*", default=[], help="capability parts (parquet)")
    p.add_argument("--cost", nargs="*", default=[], help="cost parts (parquet)")
    p.add_argument("--rope-overhead", help="rope overhead parquet")
    p.add_argument("--out-dir", required=True)
    p.set_defaults(func=_cmd_tables)
