"""Small pieces several test modules share."""
import copy


def with_key(config: dict, path: str, value) -> dict:
    """A copy of ``config`` with the dotted key ``path`` set to ``value`` (intermediate mappings created)."""
    changed = copy.deepcopy(config)
    *parents, last = path.split(".")
    node = changed
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value
    return changed
