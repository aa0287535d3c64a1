"""YAML a user wrote (scenarios, presets, sweeps, `--set` values), read safely.

PyYAML's SafeLoader builds no objects, but it keeps the last of two equal keys without a
word, and it shares an aliased node instead of copying it: ten 300-byte lines of nested
aliases stand for a list of 2^40 items, which any code that walks the value (a flattener,
an error message's repr) expands. So a user document is loaded with duplicate keys
refused (a merge key's `<<: *base` entries may be overridden, as YAML's merge says) and
its expanded size bounded before anything walks it. Failures are one-line InputErrors.
"""

from __future__ import annotations

import sys
from typing import Any

import yaml

from npusim.errors import InputError, excerpt

MAX_VALUES = 100_000  # values of a document with its aliases expanded
_MERGE = "tag:yaml.org,2002:merge"


class UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping; keys a merge key brings
    in are defaults the mapping's own keys override."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._own: dict[int, int] = {}  # id(mapping node) -> its own (non-merge) entries

    def flatten_mapping(self, node: yaml.MappingNode) -> None:
        # flatten_mapping puts the merged entries before the node's own and recurses into
        # merged nodes: count each node's own entries before it is first rewritten
        self._own.setdefault(id(node), sum(1 for k, _ in node.value if k.tag != _MERGE))
        super().flatten_mapping(node)


def _construct_mapping(loader: UniqueKeyLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    first_own = len(node.value) - loader._own.get(id(node), len(node.value))
    out: dict[Any, Any] = {}
    own: set[Any] = set()
    for i, (key_node, value_node) in enumerate(node.value):
        key = loader.construct_object(key_node, deep=True)
        try:
            duplicate = i >= first_own and key in own
        except TypeError:
            raise yaml.constructor.ConstructorError(
                None, None, f"unhashable key {excerpt(key)}", key_node.start_mark) from None
        if duplicate:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {excerpt(key)}", key_node.start_mark)
        if i >= first_own:
            own.add(key)
        out[key] = loader.construct_object(value_node, deep=True)
    return out


UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
                                _construct_mapping)


def expanded_size(doc: Any, limit: int = MAX_VALUES) -> int:
    """How many values doc holds with every alias expanded, counting stops past limit."""
    count, stack = 0, [doc]
    while stack and count <= limit:
        value = stack.pop()
        count += 1
        if isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, (list, tuple, set, frozenset)):
            stack.extend(value)
    return count


def load_text(text: str, source: str, key: str | None = None,
              malformed: str = "malformed YAML") -> Any:
    """The YAML value of text; InputError(source, key) if it is malformed (the message
    starts with `malformed`), has a key twice or expands (by aliases) past MAX_VALUES
    values."""
    try:
        doc = yaml.load(text, Loader=UniqueKeyLoader)  # a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = " ".join(str(getattr(exc, "problem", None) or "invalid YAML").split())
        raise InputError(source, key, f"{malformed}{where}: {problem}") from None
    except RecursionError:
        raise InputError(source, key, f"{malformed}: nested too deeply") from None
    except Exception as exc:  # `!!int abc`, or an integer past Python's 4300 digits
        problem = " ".join(str(exc).split())[:200]
        if isinstance(exc, ValueError) and "integer string conversion" in problem:
            problem = (f"an integer of more than {sys.get_int_max_str_digits()} digits; "
                       "allowed: the key's range")
        raise InputError(source, key, f"{malformed}: {problem}") from None
    if expanded_size(doc) > MAX_VALUES:
        raise InputError(source, key, f"expands to more than {MAX_VALUES} values (YAML "
                         "aliases nested in aliases); allowed: a document that written out "
                         "without aliases stays below that")
    return doc
