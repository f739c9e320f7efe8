"""Expand a plain dict (one config group) into the list of :class:`Case` it names.

Every key takes a scalar or a list; the grid is the cartesian product of the
lists, in key order. Keys that depend on others are derived, so one grid can mix
layouts without listing impossible combinations:

* ``heads_kv``: ``heads_q`` for mha, 1 for mqa/mla, ``heads_q // gqa_group`` for
  gqa (or an explicit ``heads_kv``, allowed only for gqa).
* ``seq``: sets ``seq_q = seq_kv`` for fwd/fwd_bwd, and ``seq_kv`` with
  ``seq_q = decode_q`` (default 1) for decode. ``seq_q``/``seq_kv`` may be given
  instead of ``seq``.
* mla uses ``mla_rank`` (d_c, default 512) and ``mla_rope_dim`` (d_h^R, default
  64): ``head_dim_qk = d_c + d_h^R`` and ``head_dim_v = d_c`` (DeepSeek-V2 §2.1,
  absorbed decode); ``head_dim`` does not apply to it.
* A decode case with one query row is stored with ``causal=False``: with the
  bottom-right aligned mask the single row sees every key, so both spellings
  are the same problem and would be duplicate rows.
* ``workload`` (a mapping, :mod:`attnbench.workloads.spec`): the batch and the per-sequence lengths
  come from a trace or a distribution instead of ``batch``/``seq``; each of its batches is one case.
* ``variant`` with its parameter (``window``, ``softcap``, ``doc_len``, ``prefix_len``): a parameter
  applies only to its own variant, so ``variant: [none, sliding_window, softcap]`` with ``window`` and
  ``softcap`` gives three cases.
"""
from __future__ import annotations

import itertools
from typing import Any, Iterable

from attnbench.case import DTYPES, LAYOUTS, MODES, VARIANT_PARAMS, VARIANTS, Case, CaseError
from attnbench.errors import reject_unknown_keys
from attnbench.workloads import spec as workload_spec

GRID_KEYS = {
    "mode": "fwd",
    "layout": "mha",
    "batch": 1,
    "heads_q": 8,
    "heads_kv": None,
    "gqa_group": 4,
    "head_dim": 64,
    "head_dim_v": None,
    "seq": None,
    "seq_q": None,
    "seq_kv": None,
    "decode_q": 1,
    "causal": False,
    "dtype": "fp32",
    "page_size": 0,
    "mla_rank": 512,
    "mla_rope_dim": 64,
    "workload": None,
    "variant": "none",
    "window": None,
    "softcap": None,
    "doc_len": None,
    "prefix_len": None,
}
DERIVED_BY_WORKLOAD = ("batch", "seq", "seq_q", "seq_kv", "decode_q")


class GridError(ValueError):
    """A grid dict has an unknown key or an impossible combination."""


def _as_list(value: Any) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _cases_from_point(point: dict, where: str) -> list[Case]:
    """The case of one grid point, or one case per batch of its workload."""
    variant = point["variant"]
    params = {name: 0 for name in VARIANT_PARAMS.values()}
    if variant in VARIANT_PARAMS:
        name = VARIANT_PARAMS[variant]
        if point[name] is None:
            raise GridError(f"variant {variant} needs {name}; allowed: set {name} in the grid")
        params[name] = point[name]
    if point["workload"] is None:
        return [_case_from_point(point, variant=variant, **params)]
    name, batches = workload_spec.form_batches(point["workload"], point["mode"], f"{where}.workload")
    cases = []
    for batch in batches:
        seq_q, seq_kv = max(batch.lens_q), max(batch.lens_kv)
        uniform = set(zip(batch.lens_q, batch.lens_kv)) == {(seq_q, seq_kv)}  # a dense batch after all
        lens_q, lens_kv = ((), ()) if uniform else (batch.lens_q, batch.lens_kv)
        cases.append(_case_from_point({**point, "batch": len(batch.lens_q), "seq": None, "seq_q": seq_q,
                                       "seq_kv": seq_kv}, variant=variant, workload=name, seq_lens_q=lens_q,
                                      seq_lens_kv=lens_kv, **params))
    return cases


def _case_from_point(point: dict, **extra) -> Case:
    layout, mode = point["layout"], point["mode"]
    heads_q = point["heads_q"]
    if point["heads_kv"] is not None and layout != "gqa":
        raise GridError(f"heads_kv is derived for layout {layout}; allowed: set heads_kv only for layout gqa (or use gqa_group)")
    if layout == "mha":
        heads_kv = heads_q
    elif layout in ("mqa", "mla"):
        heads_kv = 1
    elif point["heads_kv"] is not None:
        heads_kv = point["heads_kv"]
    else:
        group = point["gqa_group"]
        if not isinstance(group, int) or group < 1 or heads_q % group:
            raise GridError(f"gqa_group={group!r} is not allowed with heads_q={heads_q}; allowed: a positive divisor of heads_q")
        heads_kv = heads_q // group

    if point["seq"] is not None:
        if point["seq_q"] is not None or point["seq_kv"] is not None:
            raise GridError("seq cannot be combined with seq_q/seq_kv; allowed: either seq, or seq_q and seq_kv")
        seq_kv = point["seq"]
        seq_q = point["decode_q"] if mode == "decode" else seq_kv
    else:
        seq_q, seq_kv = point["seq_q"], point["seq_kv"]
        if seq_q is None or seq_kv is None:
            raise GridError("a grid needs seq, or both seq_q and seq_kv; allowed keys: " + ", ".join(GRID_KEYS))

    if layout == "mla":
        head_dim_qk = point["mla_rank"] + point["mla_rope_dim"]
        head_dim_v = point["mla_rank"]
    else:
        head_dim_qk = point["head_dim"]
        head_dim_v = point["head_dim_v"] if point["head_dim_v"] is not None else head_dim_qk

    causal = bool(point["causal"]) and not (mode == "decode" and seq_q == 1)
    if extra.get("seq_lens_q") and mode == "decode":
        extra["seq_lens_q"] = ()  # every request has its one new token
    return Case(mode=mode, layout=layout, batch=point["batch"], heads_q=heads_q, heads_kv=heads_kv,
                head_dim_qk=head_dim_qk, head_dim_v=head_dim_v, seq_q=seq_q, seq_kv=seq_kv,
                causal=causal, dtype=point["dtype"], page_size=point["page_size"], **extra)


def _value_schema(item: dict) -> dict:
    """A grid key takes one value or a non-empty list of values of this schema."""
    return {"anyOf": [item, {"type": "array", "items": item, "minItems": 1}]}


_POSITIVE = {"type": "integer", "minimum": 1}
GRID_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "mode": _value_schema({"enum": list(MODES)}),
        "layout": _value_schema({"enum": list(LAYOUTS)}),
        "batch": _value_schema(_POSITIVE),
        "heads_q": _value_schema(_POSITIVE),
        "heads_kv": _value_schema({"type": ["integer", "null"], "minimum": 1}),
        "gqa_group": _value_schema(_POSITIVE),
        "head_dim": _value_schema(_POSITIVE),
        "head_dim_v": _value_schema({"type": ["integer", "null"], "minimum": 1}),
        "seq": _value_schema({"type": ["integer", "null"], "minimum": 1}),
        "seq_q": _value_schema({"type": ["integer", "null"], "minimum": 1}),
        "seq_kv": _value_schema({"type": ["integer", "null"], "minimum": 1}),
        "decode_q": _value_schema(_POSITIVE),
        "causal": _value_schema({"type": "boolean"}),
        "dtype": _value_schema({"enum": list(DTYPES)}),
        "page_size": _value_schema({"type": "integer", "minimum": 0}),
        "mla_rank": _value_schema(_POSITIVE),
        "mla_rope_dim": _value_schema(_POSITIVE),
        "workload": _value_schema({"type": "object"}),  # its keys: attnbench.workloads.spec.SCHEMA
        "variant": _value_schema({"enum": list(VARIANTS)}),
        "window": _value_schema(_POSITIVE),
        "softcap": _value_schema({"type": "number", "exclusiveMinimum": 0}),
        "doc_len": _value_schema(_POSITIVE),
        "prefix_len": _value_schema(_POSITIVE),
    },
}


def _check_types(grid: dict, where: str) -> None:
    """One line for a wrong-typed grid value (a quoted boolean, a float length) before any case is built."""
    import jsonschema

    for key, value in grid.items():
        sub = GRID_SCHEMA["properties"][key]
        if not jsonschema.Draft202012Validator(sub).is_valid(value):
            item = sub["anyOf"][0]
            allowed = (", ".join(map(str, item["enum"])) if "enum" in item else
                       {"boolean": "true or false", "integer": "an integer", "number": "a number",
                        "object": "a mapping (docs/workloads.md)"}.get(
                           item["type"] if isinstance(item["type"], str) else item["type"][0], str(item)))
            if "minimum" in item:
                allowed += f" >= {item['minimum']}"
            if "exclusiveMinimum" in item:
                allowed += f" > {item['exclusiveMinimum']}"
            raise GridError(f"{where}.{key}={value!r} is not allowed; allowed: {allowed}, or a non-empty list of them")


def grid_size(grid: dict) -> int:
    """Points of the product before derived keys and deduplication (a workload counts its batches): what
    expanding it would cost."""
    size = 1
    for key, value in grid.items():
        if key == "workload":
            size *= sum(workload_spec.batch_count(v) for v in _as_list(value))
        else:
            size *= len(value) if isinstance(value, (list, tuple)) else 1
    return size


def expand_grid(grid: dict, where: str = "grid", max_cases: int | None = None) -> list[Case]:
    """All cases of one grid dict, deduplicated, in product order.

    Raises :class:`GridError` (or :class:`CaseError`) with a one-line message that
    names the offending key and the allowed values; ``where`` prefixes it. A product
    over ``max_cases`` points is refused before it is built.
    """
    if not isinstance(grid, dict):
        raise GridError(f"{where} must be a mapping of grid keys; allowed keys: {', '.join(GRID_KEYS)}")
    reject_unknown_keys(grid, GRID_KEYS, where, GridError)
    _check_types(grid, where)
    if "workload" in grid:
        derived = [k for k in DERIVED_BY_WORKLOAD if k in grid]
        if derived:
            raise GridError(f"{where}.{derived[0]} is not allowed with workload; allowed: the workload sets the batch "
                            "and the lengths (token_budget or requests, batches)")
    if max_cases is not None and grid_size(grid) > max_cases:
        raise GridError(f"{where}: the grid has {grid_size(grid)} points; allowed: at most max_cases={max_cases} "
                        "(raise max_cases to run it)")
    values = {key: _as_list(grid.get(key, default)) for key, default in GRID_KEYS.items()}
    cases, seen = [], set()
    for combo in itertools.product(*values.values()):
        point = dict(zip(values, combo))
        try:
            found = _cases_from_point(point, where)
        except workload_spec.WorkloadError as err:
            raise GridError(str(err)) from None
        except (GridError, CaseError) as err:
            raise type(err)(f"{where}: {err}") from None
        for case in found:
            if case not in seen:
                seen.add(case)
                cases.append(case)
    return cases


GROUP_KEYS = ("backends", "grids")


def expand_group(spec: dict, where: str, max_cases: int | None = None) -> tuple[list[Case], list[str] | None]:
    """One group of any grid stage: ``(cases, backends or None)``.

    The one grid syntax: a group is a grid (the keys of :data:`GRID_KEYS`), or ``grids: [grid, ...]``
    when shapes must move together (B*S held constant while S grows is several grids, not one
    product); an optional ``backends`` list narrows the stage's list for this group.
    """
    if not isinstance(spec, dict):
        raise GridError(f"{where} must be a mapping (a grid, or grids: [...]); allowed keys: "
                        f"{', '.join((*GROUP_KEYS, *GRID_KEYS))}")
    grid = {k: v for k, v in spec.items() if k not in GROUP_KEYS}
    backends = spec.get("backends")
    if "grids" in spec:
        if grid:
            raise GridError(f"{where}: grid key {sorted(grid)[0]!r} next to grids; allowed: either grid keys or grids")
        grids = spec["grids"]
        if not isinstance(grids, list) or not grids:
            raise GridError(f"{where}.grids must be a non-empty list of grids")
        places = [f"{where}.grids.{i}" for i in range(len(grids))]
    else:
        grids, places = [grid], [where]
    cases = []
    for one, place in zip(grids, places):
        cases += expand_grid(one, place, max_cases)
        if max_cases is not None and len(cases) > max_cases:
            raise GridError(f"{where}: {len(cases)} cases; allowed: at most max_cases={max_cases}")
    return unique_cases(cases), (list(backends) if backends is not None else None)


def unique_cases(cases: Iterable[Case]) -> list[Case]:
    return list(dict.fromkeys(cases))
