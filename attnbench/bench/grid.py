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

from attnbench.bench.case import Case, CaseError
from attnbench.keys import reject_unknown_keys

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


def expand_grid(grid: dict, where: str = "grid") -> list[Case]:
    """All cases of one grid dict, deduplicated, in product order.

    Raises :class:`GridError` (or :class:`CaseError`) with a one-line message that
    names the offending key and the allowed values; ``where`` prefixes it.
    """
    if not isinstance(grid, dict):
        raise GridError(f"{where} must be a mapping of grid keys; allowed keys: {', '.join(GRID_KEYS)}")
    reject_unknown_keys(grid, GRID_KEYS, where, GridError)
    values = {key: _as_list(grid.get(key, default)) for key, default in GRID_KEYS.items()}
    for key, options in values.items():
        if not options:
            raise GridError(f"{where}.{key} is an empty list; allowed: a value or a non-empty list")
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


def expand_groups(groups: dict[str, dict], where: str = "groups") -> dict[str, list[Case]]:
    """Expand ``{group_name: grid}``; an empty result is an error, never a silent no-op."""
    if not isinstance(groups, dict) or not groups:
        raise GridError(f"{where} must be a non-empty mapping of group name to grid")
    out = {name: expand_grid(grid, f"{where}.{name}") for name, grid in groups.items()}
    return out


def unique_cases(cases: Iterable[Case]) -> list[Case]:
    return list(dict.fromkeys(cases))
