"""The ``workload`` grid key: where a group's sequence lengths come from and how they form batches.

A grid with ``workload`` gets its batch size and lengths from it instead of ``batch``/``seq``; each of
its ``batches`` becomes one case (``docs/workloads.md``)::

    workload:
      trace: azure-conv        # azure-code, azure-conv, or a CSV path; or instead:
      # distribution: lognormal  (fixed: len; uniform: min_len, max_len; lognormal: median_len, sigma)
      token_budget: 16384      # fwd: tokens per batch (whole prompts, or chunks with `chunk`)
      chunk: 2048              # fwd: chunked prefill against cached prefixes, at most this per prompt and step
      requests: 32             # decode: requests per batch
      max_len: 8192            # clip every length (prefill: at most the token budget)
      batches: 4               # cases
      order: arrival           # or sampled
      seed: 0

Checked here with one-line errors naming the key; the stream and batches are built by
:mod:`attnbench.workloads.requests` and :mod:`attnbench.workloads.batches`.
"""
from __future__ import annotations

from attnbench.errors import reject_unknown_keys
from attnbench.workloads.batches import ORDERS, Batch, BatchError, chunked_batches, decode_batches, prefill_batches
from attnbench.workloads.requests import DISTRIBUTIONS, SHIPPED, RequestsError, synthetic, trace

KEYS = ("trace", "distribution", "len", "min_len", "max_len", "median_len", "sigma", "token_budget", "chunk",
        "requests", "batches", "order", "seed")
DEFAULT_BATCHES = 4
_POSITIVE = {"type": "integer", "minimum": 1}
SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "trace": {"type": "string", "minLength": 1},
        "distribution": {"enum": list(DISTRIBUTIONS)},
        "len": _POSITIVE, "min_len": _POSITIVE, "max_len": _POSITIVE,
        "median_len": {"type": "number", "exclusiveMinimum": 0},
        "sigma": {"type": "number", "exclusiveMinimum": 0, "maximum": 10},
        "token_budget": _POSITIVE, "chunk": _POSITIVE, "requests": _POSITIVE,
        "batches": {"type": "integer", "minimum": 1, "maximum": 10000},
        "order": {"enum": list(ORDERS)},
        "seed": {"type": "integer", "minimum": 0, "maximum": 2**31 - 1},
    },
}
NEEDS = {"fixed": ("len",), "uniform": ("min_len", "max_len"), "lognormal": ("median_len", "sigma")}


class WorkloadError(ValueError):
    """A workload mapping that cannot form batches; the message is one line naming the key."""


def batch_count(spec) -> int:
    """Cases a workload mapping expands to (for the grid's size check, before any work)."""
    return spec.get("batches", DEFAULT_BATCHES) if isinstance(spec, dict) else 1


def check(spec, where: str) -> dict:
    """The mapping, checked: known keys, typed values, exactly one source, the keys its mode needs later."""
    import jsonschema

    if not isinstance(spec, dict):
        raise WorkloadError(f"{where} must be a mapping; allowed keys: {', '.join(KEYS)}")
    reject_unknown_keys(spec, KEYS, where, WorkloadError)
    for key, value in spec.items():
        if not jsonschema.Draft202012Validator(SCHEMA["properties"][key]).is_valid(value):
            item = SCHEMA["properties"][key]
            allowed = ", ".join(item["enum"]) if "enum" in item else (
                f"{item['type']}" + (f" >= {item['minimum']}" if "minimum" in item else "")
                + (f" > {item['exclusiveMinimum']}" if "exclusiveMinimum" in item else ""))
            raise WorkloadError(f"{where}.{key}={value!r} is not allowed; allowed: {allowed}")
    if ("trace" in spec) == ("distribution" in spec):
        raise WorkloadError(f"{where} needs exactly one of trace ({', '.join(SHIPPED)}, or a CSV path) and "
                            f"distribution ({', '.join(DISTRIBUTIONS)})")
    if "distribution" in spec:
        for key in NEEDS[spec["distribution"]]:
            if key not in spec:
                raise WorkloadError(f"{where}: distribution {spec['distribution']} needs {key}")
    if spec.get("distribution") == "uniform" and spec["min_len"] > spec["max_len"]:
        raise WorkloadError(f"{where}.min_len={spec['min_len']} is not allowed; allowed: <= max_len={spec['max_len']}")
    return spec


def form_batches(spec: dict, mode: str, where: str) -> tuple[str, list[Batch]]:
    """(workload name, batches) for a grid point of ``mode`` (fwd: prefill or chunked prefill; decode)."""
    spec = check(spec, where)
    if mode == "fwd_bwd":
        raise WorkloadError(f"{where}: mode fwd_bwd is not allowed with a workload; allowed: fwd, decode")
    size_key = "requests" if mode == "decode" else "token_budget"
    wrong = "token_budget" if mode == "decode" else "requests"
    if size_key not in spec:
        raise WorkloadError(f"{where}: mode {mode} needs {size_key}")
    for key in (wrong, *(("chunk",) if mode == "decode" else ())):
        if key in spec:
            raise WorkloadError(f"{where}.{key} is not allowed for mode {mode}; allowed: {size_key}")
    count, order, seed = spec.get("batches", DEFAULT_BATCHES), spec.get("order", "arrival"), spec.get("seed", 0)
    try:
        if "trace" in spec:
            requests = trace(spec["trace"])
        else:
            # enough requests for any batching: a prefill batch holds at most token_budget one-token prompts
            per_batch = spec["requests"] if mode == "decode" else spec["token_budget"] // spec.get("min_len", 1) + 1
            requests = synthetic(spec["distribution"], per_batch * count + 1, seed=seed, length=spec.get("len"),
                                 min_len=spec.get("min_len", 1), max_len=spec.get("max_len"),
                                 median_len=spec.get("median_len"), sigma=spec.get("sigma"))
        max_len = spec.get("max_len")
        if mode == "decode":
            batches = decode_batches(requests, size=spec["requests"], count=count, order=order, seed=seed,
                                     max_len=max_len)
        elif "chunk" in spec:
            batches = chunked_batches(requests, token_budget=spec["token_budget"], chunk=spec["chunk"], count=count,
                                      order=order, seed=seed, max_len=max_len)
        else:
            batches = prefill_batches(requests, token_budget=spec["token_budget"], count=count, order=order, seed=seed,
                                      max_len=max_len)
    except (RequestsError, BatchError) as err:
        raise WorkloadError(f"{where}: {err}") from None
    return requests.name, batches
