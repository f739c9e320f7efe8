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
"""
from __future__ import annotations

import itertools
from typing import Any, Iterable

from attnbench.case import DTYPES, LAYOUTS, MODES, Case, CaseError
from attnbench.errors import reject_unknown_keys

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
}


class GridError(ValueError):
    """A grid dict has an unknown key or an impossible combination."""


def _as_list(value: Any) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _case_from_point(point: dict) -> Case:
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
    return Case(mode=mode, layout=layout, batch=point["batch"], heads_q=heads_q, heads_kv=heads_kv,
                head_dim_qk=head_dim_qk, head_dim_v=head_dim_v, seq_q=seq_q, seq_kv=seq_kv,
                causal=causal, dtype=point["dtype"], page_size=point["page_size"])


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
                       {"boolean": "true or false", "integer": "an integer"}.get(
                           item["type"] if isinstance(item["type"], str) else item["type"][0], str(item)))
            if "minimum" in item:
                allowed += f" >= {item['minimum']}"
            raise GridError(f"{where}.{key}={value!r} is not allowed; allowed: {allowed}, or a non-empty list of them")


def grid_size(grid: dict) -> int:
    """Points of the product before derived keys and deduplication: what expanding it would cost."""
    size = 1
    for value in grid.values():
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
    if max_cases is not None and grid_size(grid) > max_cases:
        raise GridError(f"{where}: the grid has {grid_size(grid)} points; allowed: at most max_cases={max_cases} "
                        "(raise max_cases to run it)")
    values = {key: _as_list(grid.get(key, default)) for key, default in GRID_KEYS.items()}
    cases, seen = [], set()
    for combo in itertools.product(*values.values()):
        point = dict(zip(values, combo))
        try:
            case = _case_from_point(point)
        except (GridError, CaseError) as err:
            raise type(err)(f"{where}: {err}") from None
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
