"""Load a sweep config once: read the YAML safely, resolve ``extends:``, check every section against its schema.

Everything that can be wrong with a config is reported here or in :mod:`attnbench.plan`, before any
job starts, as one line naming the key and the allowed values (:class:`~attnbench.errors.ConfigError`).

Reading (:func:`read_yaml`): YAML is safe-loaded, with three limits a hostile or mistaken file
cannot pass: a size limit (:data:`MAX_CONFIG_BYTES`), no anchors or aliases (a few nested aliases
expand to gigabytes when the config is written out), and no key twice in one mapping (YAML keeps
the last silently).

``extends: <file>`` (a path relative to the file that says it) derives a sweep from another: the
base is loaded first (it may extend another, up to :data:`MAX_EXTENDS_DEPTH` files, no cycles),
then this file is deep-merged over it: mappings merge key by key, lists and scalars replace, and a key
set to null is removed (``groups: {prefill: null}`` drops the base's group). The chain, base first, is
recorded in the effective config as ``sources``. A file without ``extends:``
is a complete config.

Validation (:func:`validate_config`): the top-level schema (``schemas/config.schema.yaml``) and one
schema per section (``schemas/<section>.schema.yaml``), JSON Schema 2020-12 with the schemas'
defaults filled in (what ``snakemake.utils.validate`` does; done here so that the command line
checks a config the same way without Snakemake). The planner then checks what a schema cannot
(backend names, grids, run recipes) for every device.
"""
from __future__ import annotations

import copy
import functools
import math
from importlib.resources import files
from pathlib import Path

import jsonschema
import referencing
import torch
import yaml
from referencing.jsonschema import DRAFT202012

from attnbench.errors import NAME_PATTERN, ConfigError

SCHEMA_DIR = files("attnbench") / "schemas"
SECTIONS = ("stability", "hbm", "pretrain", "context", "triton", "context_parallel", "report")  # schemas/<section>.schema.yaml each
MAX_CONFIG_BYTES = 1 << 20
MAX_EXTENDS_DEPTH = 8
DEFAULT_CONFIG = Path("config") / "config.yaml"


# ----------------------------------------------------------------------------------------------- reading

class _StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` without anchors or aliases, and without duplicate keys in a mapping."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise ConfigError(f"{self.name}: line {event.start_mark.line + 1}: YAML aliases (*{event.anchor}) are not "
                              "allowed; allowed: write the value out")
        event = self.peek_event()
        if getattr(event, "anchor", None):
            raise ConfigError(f"{self.name}: line {event.start_mark.line + 1}: YAML anchors (&{event.anchor}) are not "
                              "allowed; allowed: write the value out")
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                hash(key)
            except TypeError:  # SafeLoader's own check below names it
                continue
            if key in seen:
                raise ConfigError(f"{self.name}: line {key_node.start_mark.line + 1}: key {key!r} appears twice in one "
                                  "mapping; allowed: each key once")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: str | Path) -> dict:
    """The mapping a YAML config file holds; one-line :class:`ConfigError` for anything else."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    size = path.stat().st_size
    if size > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: {size} bytes; allowed: a config of at most {MAX_CONFIG_BYTES} bytes")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text; allowed: a YAML file") from None
    loader = _StrictLoader(text)
    loader.name = str(path)
    try:
        value = loader.get_single_data()
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({' '.join(str(err).split())[:200]})") from None
    finally:
        loader.dispose()
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: holds a {type(value).__name__}; allowed: a mapping of config keys "
                          "(config/README.md)")
    return value


def deep_merge(base: dict, over: dict) -> dict:
    """``over`` on top of ``base``: mappings merge key by key; lists and scalars replace; a key that ``over``
    sets to null is removed (the schema's default applies again). Neither argument is changed."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _resolve(path: Path, chain: list[Path]) -> tuple[dict, list[Path]]:
    path = path.resolve()
    if path in chain:
        raise ConfigError(f"{chain[-1]}: extends {str(path)!r}, which extends it back; allowed: a chain without cycles")
    if len(chain) >= MAX_EXTENDS_DEPTH:
        raise ConfigError(f"{path}: extends chain of more than {MAX_EXTENDS_DEPTH} files; allowed: at most "
                          f"{MAX_EXTENDS_DEPTH}")
    config = read_yaml(path)
    base = config.pop("extends", None)
    if base is None:
        return config, [path]
    if not isinstance(base, str) or not base:
        raise ConfigError(f"{path}: extends={base!r}; allowed: the path of another sweep file, relative to this one")
    parent, sources = _resolve(path.parent / base, chain + [path])
    return deep_merge(parent, config), sources + [path]


def _source_name(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def load_files(paths: list[str | Path], overrides: dict | None = None) -> dict:
    """The merged, unvalidated config of ``paths`` (each with its ``extends:`` chain, later files on top)
    and ``overrides`` (``snakemake --config`` values) on top of all; ``sources`` records the files read."""
    merged, sources = {}, []
    for path in paths:
        config, chain = _resolve(Path(path), [])
        merged = deep_merge(merged, config)
        sources += [_source_name(p) for p in chain]
    merged = deep_merge(merged, overrides or {})
    merged["sources"] = sources
    return merged


def command_line_overrides(values: dict) -> dict:
    """``snakemake --config key=value`` values, typed as YAML types them.

    Snakemake types a plain value itself (int, float, bool, string) but reads a structured one
    (``timing='{rep_ms: 7}'``, ``stages=[microbench]``) with YAML's BaseLoader, which leaves every
    scalar a string; the leaves of those are read again with the safe loader (``'7'`` -> 7).
    """
    def typed(value, nested: bool):
        if isinstance(value, dict):
            return {k: typed(v, True) for k, v in value.items()}
        if isinstance(value, list):
            return [typed(v, True) for v in value]
        if nested and isinstance(value, str):
            loader = _StrictLoader(value)
            loader.name = "--config"
            try:
                parsed = loader.get_single_data()
            except yaml.YAMLError:
                return value
            finally:
                loader.dispose()
            return parsed if not isinstance(parsed, (dict, list)) else value
        return value

    return {key: typed(value, False) for key, value in values.items()}


def load_config(path: str | Path, overrides: dict | None = None) -> dict:
    """Read, resolve ``extends:``, and validate one config file: the validated, default-filled config."""
    return validate_config(load_files([path], overrides))


# ----------------------------------------------------------------------------------------------- validation

def load_schema(section: str | None = None) -> dict:
    """The top-level schema, or a section's (``schemas/<section>.schema.yaml``)."""
    return yaml.safe_load((SCHEMA_DIR / f"{section or 'config'}.schema.yaml").read_text())


@functools.cache
def _registry() -> referencing.Registry:
    """Every schema under its file name, so that a section can ``$ref`` another's keys
    (``context.capability.model`` is ``pretrain.schema.yaml#/properties/model``)."""
    return referencing.Registry().with_resources(
        (f"{name}.schema.yaml", referencing.Resource.from_contents(load_schema(name), DRAFT202012))
        for name in ("config", *SECTIONS))


_BOUNDS = ("type", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minItems", "maxItems",
           "uniqueItems")
_NOUNS = {"integer": "an integer", "number": "a number", "string": "a string", "boolean": "true or false",
          "array": "a list", "object": "a mapping", "null": "null"}


def _range(low, high, low_op: str, high_op: str) -> str:
    """Bounds as words: ``from 1 to 8`` when both are inclusive, else ``> 0``, ``<= 1`` joined by ``and``."""
    if low is not None and high is not None and (low_op, high_op) == (">=", "<="):
        return f"from {low} to {high}"
    return " and ".join(f"{op} {bound}" for op, bound in ((low_op, low), (high_op, high)) if bound is not None)


def _items(low, high, distinct: bool) -> str:
    """A list's length bounds as words: ``of 1 to 8 distinct items``, ``of at least one item``, ``of at most 4 items``."""
    if low is not None and high is not None:
        count = f"{low} to {high}"
    elif low is not None:
        count = "at least one" if low == 1 else f"at least {low}"
    else:
        count = f"at most {high}" if high is not None else ""
    noun = "item" if count == "at least one" else "items"
    return " ".join(w for w in ("of", count, "distinct" if distinct else "", noun) if w)


def _allowed(schema: dict) -> str:
    """What a schema admits, in words: its type and its bounds (``an integer from 1 to 65536``, ``a number > 0``,
    ``a list of 1 to 8 distinct items``, ``an integer from 1 to 50, or null``)."""
    types = schema.get("type", [])
    types = [types] if isinstance(types, str) else types
    noun = " or ".join(_NOUNS.get(t, t) for t in types if t != "null") or "a value"
    low, low_op = (schema["exclusiveMinimum"], ">") if "exclusiveMinimum" in schema else (schema.get("minimum"), ">=")
    high, high_op = (schema["exclusiveMaximum"], "<") if "exclusiveMaximum" in schema else (schema.get("maximum"), "<=")
    words = [noun, _range(low, high, low_op, high_op)]
    if "minItems" in schema or "maxItems" in schema or schema.get("uniqueItems"):
        words.append(_items(schema.get("minItems"), schema.get("maxItems"), bool(schema.get("uniqueItems"))))
    return " ".join(w for w in words if w) + (", or null" if "null" in types else "")


def _schema_message(err: jsonschema.ValidationError, root: str = "") -> str:
    """One line naming the key: ``root`` (the validated value's own key, if any) joined to the error's path."""
    where = ".".join(str(p) for p in [*([root] if root else []), *err.absolute_path]) or "config"
    if err.validator == "anyOf" and err.context:  # a name or null: what the name must match, or the types allowed
        specific = [e for e in err.context if e.validator != "type"]
        if specific:
            return _schema_message(specific[0], root)
        types = dict.fromkeys(str(e.validator_value) for e in err.context)
        return f"{where}={err.instance!r} is not allowed; allowed: {' or '.join(types)}"
    if err.validator == "additionalProperties":
        allowed = ", ".join(err.schema.get("properties", {})) or "none"
        extra = sorted(set(err.instance) - set(err.schema.get("properties", {})), key=str)
        return f"{where}: unknown key {extra[0]!r}; allowed: {allowed}"
    if err.validator == "enum":
        return f"{where}={err.instance!r} is not allowed; allowed: {', '.join(map(str, err.validator_value))}"
    if err.validator == "pattern":
        noun = "name" if err.validator_value == NAME_PATTERN.pattern else "value"
        return f"{where}={err.instance!r} is not allowed; allowed: a {noun} matching {err.validator_value}"
    if err.validator in _BOUNDS:  # the type and the bounds the key's schema sets, in one phrase
        shown = repr(err.instance)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        return f"{where}={shown} is not allowed; allowed: {_allowed(err.schema)}"
    if err.validator == "propertyNames":
        return f"{where}: a name in this mapping is not allowed ({err.message}); allowed: names matching the pattern"
    message = " ".join(err.message.split())
    return f"{where}: {message[:300]}"


def _finite(value, where: str) -> None:
    """NaN and infinity parse as YAML floats (``.nan``, ``.inf``) and pass a schema's number checks."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{where}={value!r} is not allowed; allowed: a finite number")
    if isinstance(value, dict):
        for key, sub in value.items():
            _finite(sub, f"{where}.{key}" if where else str(key))
    elif isinstance(value, list):
        for i, sub in enumerate(value):
            _finite(sub, f"{where}.{i}")


def validate_section(value, schema: dict, where: str) -> dict:
    """Check ``value`` against ``schema`` and return it with the schema's defaults filled in.

    ``where`` is the value's dotted key in the config (``hbm``, ``context.capability.cuda``; ``""``
    for the whole config); the ConfigError names the offending key below it, e.g. ``hbm.ledger.batch: ...``.
    """
    _finite(value, where)
    errors = sorted(jsonschema.Draft202012Validator(schema, registry=_registry()).iter_errors(value),
                    key=lambda e: (len(e.absolute_path), [str(p) for p in e.absolute_path]))
    if errors:
        raise ConfigError(_schema_message(errors[0], where))
    return with_defaults(value, schema)


def with_defaults(instance: dict, schema: dict) -> dict:
    """Fill ``default`` values of the schema's properties, recursively (what snakemake.utils.validate does)."""
    out = dict(instance)
    for key, sub in schema.get("properties", {}).items():
        if key not in out and "default" in sub:
            out[key] = copy.deepcopy(sub["default"])
        if isinstance(out.get(key), dict) and sub.get("type") == "object":
            out[key] = with_defaults(out[key], sub)
    return out


def section_defaults(section: str) -> dict:
    """A section as a config that leaves it out gets it: the schema's defaults, filled in."""
    return with_defaults({}, load_schema(section))


def validate_config(config) -> dict:
    """Schema-check the whole config and each section (defaults filled); returns the filled config.

    What a schema cannot check (backends, grids, runs) is checked by :func:`attnbench.plan.check_config`.
    """
    if not isinstance(config, dict):
        raise ConfigError("config must be a mapping; see config/README.md")
    config = validate_section(config, load_schema(), "")
    for section in SECTIONS:
        config[section] = validate_section(config.get(section, {}), load_schema(section), section)
    return config


def resolve_device(config: dict) -> tuple[str, str]:
    """(device, why): ``auto`` picks cuda when torch sees a CUDA device."""
    wanted = config.get("device", "auto")
    if wanted == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device='cuda' but torch sees no CUDA device; allowed here: auto, cpu")
    if wanted != "auto":
        return wanted, f"device: {wanted} in the config"
    if torch.cuda.is_available():
        return "cuda", f"device: auto, and torch sees {torch.cuda.get_device_name()}"
    return "cpu", f"device: auto, and torch {torch.__version__} sees no CUDA device"
