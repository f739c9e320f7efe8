"""The compiler's report without a GPU: each autotuning config compiled ahead of time for an NVIDIA target.

``triton.compile`` takes an explicit target (``GPUTarget("cuda", 90, 32)`` is
Hopper) and runs ptxas from the Triton wheel, so registers, spill space,
shared memory and the SASS instruction mix of every config can be read on a
CPU-only host; this is how the config tables of :mod:`.tuning` were chosen.
The signature mirrors a launch on the benchmark grid (MHA, 16 heads,
contiguous BHSD tensors, sequence 4096): Triton specialises integer
arguments equal to 1 as constants and marks multiples of 16 (pointers too)
divisible by 16, and the same is done here. Resource usage comes from
``cuobjdump -res-usage`` (``REG``: registers per thread, ``STACK``: per-thread
stack frame, where spilled registers go), the mix from
:func:`attnbench.kernels.triton.sass.opcode_counts`.

``shared_bytes`` is the dynamic shared memory Triton allocates (pipeline buffers).

usage: ``python -m attnbench.kernels.triton.aot [--arch 90] [--kinds fwd bwd dkdv dq fp8]``
(``bwd``: the atomic-dQ backward; ``dkdv``, ``dq``: the two kernels of the separate-dQ path)
(use the Triton version the GPU host runs; the GPU script re-measures this on the device).
"""
from __future__ import annotations

import argparse
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from attnbench.failures import first_line
from attnbench.kernels.triton import backward, forward, tuning
from attnbench.kernels.triton.fp8 import BLOCK_ROWS
from attnbench.kernels.triton.sass import OPCODES, opcode_counts

HEADS, SEQ = 16, 4096


def _bhsd_strides(heads: int, seq: int, dim: int, transposed: bool = False) -> list[int]:
    """Strides of a contiguous (B, H, S, D) tensor, or of one stored (B, H, D, S) and viewed as BHSD."""
    return [heads * seq * dim, seq * dim, 1, seq] if transposed else [heads * seq * dim, seq * dim, dim, 1]


def _source(fn, pointers: dict, scalars: dict, constexprs: dict) -> ASTSource:
    """An ASTSource specialised the way a launch with these argument values would be."""
    sig, const, attrs = {}, dict(constexprs), {}
    for i, name in enumerate(fn.arg_names):
        if name in pointers:
            if pointers[name] is None:
                sig[name], const[name] = "constexpr", None
            else:
                sig[name] = f"*{pointers[name]}"
                attrs[(i,)] = [["tt.divisibility", 16]]
        elif name in scalars:
            value, specialise = scalars[name], not fn.params[i].do_not_specialize
            if isinstance(value, float):
                sig[name] = "fp32"
            elif value == 1 and specialise:
                sig[name], const[name] = "constexpr", 1
            else:
                sig[name] = "i32"
                if value % 16 == 0 and specialise:
                    attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            sig[name] = "constexpr"
    return ASTSource(fn, sig, const, attrs)


def forward_source(config, head_dim: int, causal: bool, fp8: bool) -> ASTSource:
    elt = "fp8e4nv" if fp8 else "bf16"
    pointers = dict(Q=elt, K=elt, V=elt, O="bf16", LSE="fp32", QS="fp32" if fp8 else None,
                    KS="fp32" if fp8 else None, VS="fp32" if fp8 else None, CU_Q=None, CU_KV=None)
    scalars = dict(sm_scale=head_dim ** -0.5, heads_q=HEADS, group=1, seq_q=SEQ, seq_kv=SEQ,
                   n_scale_q=SEQ // BLOCK_ROWS, n_scale_kv=SEQ // BLOCK_ROWS,
                   **_stride_args(head_dim, (("q", "m"), ("k", "n"), ("o", "m"))),
                   **_stride_args(head_dim, (("v", "n"),), transposed=fp8))  # fp8 V is stored (B, H, D, S)
    constexprs = dict(HEAD_DIM=head_dim, CAUSAL=causal, FP8=fp8, SCALE_ROWS=BLOCK_ROWS if fp8 else 0, VARLEN=False,
                      **config.kwargs)
    return _source(forward._attn_fwd, pointers, scalars, constexprs)


def backward_source(config, head_dim: int, causal: bool, dq_atomic: bool = True) -> ASTSource:
    """``_attn_bwd``: with ``dq_atomic`` the atomic path's kernel, without it the dK/dV-only kernel."""
    pointers = dict(Q="bf16", K="bf16", V="bf16", DO="bf16", LSE="fp32", DELTA="fp32",
                    DQ_ACC="fp32" if dq_atomic else None, DK="bf16", DV="bf16")
    scalars = dict(sm_scale=head_dim ** -0.5, heads_kv=HEADS, group=1, seq_q=SEQ, seq_kv=SEQ,
                   **_stride_args(head_dim, (("q", "m"), ("k", "n"), ("v", "n"), ("d", "m"), ("dk", "n"), ("dv", "n"))))
    constexprs = dict(HEAD_DIM=head_dim, CAUSAL=causal, DQ_ATOMIC=dq_atomic, **config.kwargs)
    return _source(backward._attn_bwd, pointers, scalars, constexprs)


def dq_source(config, head_dim: int, causal: bool) -> ASTSource:
    """``_attn_bwd_dq``, the separate path's dQ kernel."""
    pointers = dict(Q="bf16", K="bf16", V="bf16", DO="bf16", LSE="fp32", DELTA="fp32", DQ="bf16")
    scalars = dict(sm_scale=head_dim ** -0.5, heads_q=HEADS, group=1, seq_q=SEQ, seq_kv=SEQ,
                   **_stride_args(head_dim, (("q", "m"), ("k", "n"), ("v", "n"), ("d", "m"), ("dq", "m"))))
    constexprs = dict(HEAD_DIM=head_dim, CAUSAL=causal, **config.kwargs)
    return _source(backward._attn_bwd_dq, pointers, scalars, constexprs)


def _stride_args(head_dim: int, tensors, transposed: bool = False) -> dict:
    """``stride_<prefix>{b,h,<rows>,d}`` of BHSD tensors (contiguous, or ``transposed`` as in
    :func:`_bhsd_strides`), for (prefix, rows) in ``tensors``."""
    strides = _bhsd_strides(HEADS, SEQ, head_dim, transposed)
    return {f"stride_{prefix}{axis}": value for prefix, rows in tensors
            for axis, value in zip(("b", "h", rows, "d"), strides)}


def resources(cubin: bytes) -> dict:
    """Registers, stack frame, static shared and local memory of the kernel in a cubin (``cuobjdump -res-usage``)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([triton.knobs.nvidia.cuobjdump.path, "-res-usage", f.name], capture_output=True,
                              text=True, check=True).stdout
    names = {"REG": "regs", "STACK": "stack_bytes", "SHARED": "static_shared", "LOCAL": "local_bytes"}
    return {names[k]: int(v) for k, v in re.findall(r"\b(REG|STACK|SHARED|LOCAL):(\d+)", text)}


def wgmma_serialized(ptx: str, arch: int) -> bool | None:
    """Whether ptxas reports (C7511) that it serialised the kernel's wgmma: each ``HGMMA`` is then followed by a
    wait for all (``WARPGROUP.DEPBAR.LE gsb0, 0x0``), so no wgmma stays in flight across other work. ``None`` where
    none of Triton's ptxas binaries takes the PTX (Triton 3.9 emits PTX 9.4 for the newer of its two)."""
    nvidia = triton.knobs.nvidia
    paths = [knob.path for knob in (nvidia.ptxas, getattr(nvidia, "ptxas_blackwell", None)) if knob is not None]
    with tempfile.TemporaryDirectory() as tmp:
        with open(f"{tmp}/k.ptx", "w") as f:
            f.write(ptx)
        for path in paths:
            done = subprocess.run([path, f"-arch=sm_{arch}a", "-v", f"{tmp}/k.ptx", "-o", f"{tmp}/k.cubin"],
                                  capture_output=True, text=True)
            if done.returncode == 0:
                return "C7511" in done.stdout + done.stderr
    return None


def compile_row(kind: str, head_dim: int, config, arch: int = 90, causal: bool = True) -> dict:
    """Compile one config of one kernel for ``sm_<arch>``: its resources, dynamic shared memory and SASS mix."""
    from triton.tools.disasm import get_sass

    if kind in ("bwd", "dkdv"):
        src = backward_source(config, head_dim, causal, dq_atomic=kind == "bwd")
    elif kind == "dq":
        src = dq_source(config, head_dim, causal)
    else:
        src = forward_source(config, head_dim, causal, kind == "fp8")
    row = dict(kernel=kind, head_dim=head_dim, warps=config.num_warps, stages=config.num_stages, **config.kwargs)
    try:
        compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                                  options={"num_warps": config.num_warps, "num_stages": config.num_stages})
    except Exception as err:  # a config that does not compile is itself a finding
        row["error"] = first_line(err)[:200]
        return row
    row.update(resources(compiled.asm["cubin"]), shared_bytes=compiled.metadata.shared,
               wgmma_serialized=wgmma_serialized(compiled.asm["ptx"], arch))
    counts = opcode_counts(get_sass(compiled.asm["cubin"]))
    row.update({op: counts.get(op, 0) for op in OPCODES if counts.get(op, 0)})
    return row


def report(kinds=tuple(tuning.TABLES), arch: int = 90) -> list[dict]:
    """One row per (kernel, head dim, config) of the autotuning tables, causal variants."""
    return [compile_row(kind, head_dim, config, arch) for kind in kinds for head_dim in (64, 128)
            for config in tuning.TABLES[kind][head_dim]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, default=90, help="compute capability x 10 (90: Hopper)")
    parser.add_argument("--kinds", nargs="+", default=list(tuning.TABLES), choices=list(tuning.TABLES))
    args = parser.parse_args()
    print(f"triton {triton.__version__}, sm_{args.arch}, causal, MHA H{HEADS} S{SEQ}, bf16 (fp8: e4m3)")
    for row in report(args.kinds, args.arch):
        print("  ".join(f"{k}={v}" for k, v in row.items()))


if __name__ == "__main__":
    main()
