"""The error every config-like mapping raises, the one pattern every name matches, and the checks each
mapping gets: no key outside the allowed ones, names that match the pattern, and a list of backend names
drawn from the allowed ones.

At the base of the package (beside :mod:`attnbench.case`), so that models, stages and the
planner raise the same :class:`ConfigError` without importing the config loader.
"""
from __future__ import annotations

import re
from typing import Iterable

# every name that becomes a path component, a wildcard or a word on a command line (docs/security.md,
# "Names: one pattern"); the schemas' config.schema.yaml#/$defs/name holds the same
# (tests/security/test_config_attacks.py)
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class ConfigError(ValueError):
    """A config that cannot run; the message is one line naming the key and the allowed values."""


def reject_unknown_keys(values: Iterable[str], allowed: Iterable[str], where: str,
                        error: type[Exception] = ConfigError) -> None:
    """Raise ``error`` naming the first unknown key (sorted) and every allowed key, on one line."""
    allowed = list(allowed)
    unknown = sorted(set(values) - set(allowed))
    if unknown:
        raise error(f"{where}: unknown key {unknown[0]!r}; allowed: {', '.join(allowed)}")


def check_name(value, where: str) -> str:
    """A sweep, group, backend, experiment, run or variant name, or one line naming the pattern."""
    if not isinstance(value, str) or not NAME_PATTERN.match(value):
        raise ConfigError(f"{where}={value!r} is not allowed; allowed: a name matching {NAME_PATTERN.pattern}")
    return value


def check_backend_names(names, allowed: Iterable[str], where: str) -> list[str]:
    """A group's backends: a non-empty list of names from ``allowed``, or one line naming the first other one."""
    allowed = list(allowed)
    if not isinstance(names, list) or not names:
        raise ConfigError(f"{where} must be a non-empty list; allowed: {', '.join(allowed)}")
    for name in names:
        if name not in allowed:
            raise ConfigError(f"{where}: backend={name!r} is not known; allowed: {', '.join(allowed)}")
    return list(names)
