"""The compiler's report on a compiled Triton kernel: registers, spills, shared memory, SASS instruction mix.

What the mix tells (NVIDIA's instruction set reference, "Hopper instruction
set"): ``HGMMA`` is Hopper's asynchronous warpgroup MMA (wgmma) on fp16/bf16,
``QGMMA`` its fp8 form, ``HMMA`` the older warp-level mma.sync a kernel falls
back to when wgmma is not used; ``UTMALDG``/``UTMASTG`` are TMA bulk tensor
loads/stores, ``LDGSTS`` the cp.async copies of the pointer path; ``RED`` and
``ATOMG`` global reductions/atomics (the backward's dQ); ``MUFU`` the special
function unit (``exp2``, reciprocals); ``LDL``/``STL`` local-memory traffic
(register spills).
"""
from __future__ import annotations

import collections

OPCODES = ("HGMMA", "QGMMA", "HMMA", "UTMALDG", "UTMASTG", "LDGSTS", "LDG", "STG", "REDG", "RED", "ATOMG", "MUFU",
           "LDL", "STL", "BAR", "WARPSYNC")


def opcode_counts(sass: str) -> collections.Counter:
    """Static count of each SASS opcode (without modifiers) in ``nvdisasm`` text as Triton prints it.

    Triton's ``get_sass`` lines read ``<control codes>\\t[@P0 ]OPCODE.MODIFIERS operands;``.
    """
    counts: collections.Counter = collections.Counter()
    for line in sass.splitlines():
        if "\t" not in line:
            continue
        words = line.split("\t", 1)[1].split()
        if words and words[0].startswith("@"):
            words = words[1:]
        if words and words[0][:1].isalpha() and words[0][:1].isupper():
            counts[words[0].split(".")[0]] += 1
    return counts


def compiler_report(name: str, kernel) -> dict:
    """Registers, spills and shared memory of a loaded ``CompiledKernel``, its config, and the SASS mix."""
    meta = kernel.metadata
    row = {"kernel": name, "n_regs": getattr(kernel, "n_regs", None), "n_spills": getattr(kernel, "n_spills", None),
           "shared_bytes": getattr(meta, "shared", None), "num_warps": getattr(meta, "num_warps", None),
           "num_stages": getattr(meta, "num_stages", None)}
    constants = getattr(getattr(kernel, "src", None), "constants", {}) or {}
    fn = getattr(getattr(kernel, "src", None), "fn", None)
    names = getattr(fn, "arg_names", [])
    for key, value in constants.items():
        index = key[0] if isinstance(key, tuple) else key
        label = names[index] if isinstance(index, int) and index < len(names) else str(index)
        if label.isupper() and isinstance(value, (bool, int)):  # meta-parameters: BLOCK_M, HEAD_DIM, USE_TMA, ...
            row[label] = value
    try:
        counts = opcode_counts(kernel.asm["sass"])
    except Exception as err:  # nvdisasm missing or the cubin unreadable: say so in the report
        row["sass_error"] = f"{type(err).__name__}: {err}"
        return row
    row.update({f"sass_{op}": counts.get(op, 0) for op in OPCODES})
    row["sass_total"] = sum(counts.values())
    return row
