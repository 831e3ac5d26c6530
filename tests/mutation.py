"""Wrong-typed payloads for the property tests of the decoders (tests/test_properties_*.py).

A valid fixture body is taken apart into the paths of its fields (every key of every object,
every item of every list); a mutant is the body with the value at one path replaced by a value
of another JSON type. ``ODD_VALUES`` holds one value of every JSON type; ``json_values`` is the
hypothesis strategy of any JSON value, and the settings every property test shares are
``BOUNDED``: a fixed example count, no deadline, no example database, derandomized, so that CI
runs the same examples in the same time on every machine.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

Path_ = tuple[str | int, ...]

# one value of every JSON type (and an empty string, list and object, which read as "absent"
# where a truthiness test stands in for a presence test)
ODD_VALUES: tuple[Any, ...] = (None, True, 7, 2.5, "odd", [1], {"odd": 1}, "", [], {})

BOUNDED = settings(
    max_examples=300,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def load(path: Path) -> Any:
    return orjson.loads(path.read_bytes())


def copy(value: Any) -> Any:
    return orjson.loads(orjson.dumps(value))


def paths(doc: Any, prefix: Path_ = ()) -> Iterator[Path_]:
    """Every field's path in ``doc``, parents before children."""
    if isinstance(doc, dict):
        items: Any = doc.items()
    elif isinstance(doc, list):
        items = enumerate(doc)
    else:
        return
    for key, value in items:
        path = (*prefix, key)
        yield path
        yield from paths(value, path)


def replaced(doc: Any, path: Path_, value: Any) -> Any:
    """A copy of ``doc`` with the value at ``path`` replaced by ``value``."""
    out = copy(doc)
    node = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = copy(value)
    return out


def camel(key: str) -> str:
    head, *rest = key.split("_")
    return head + "".join(word[:1].upper() + word[1:] for word in rest)


def names(path: Path_) -> set[str]:
    """The field names along a path (a proto-spelled name also in its JSON spelling): one of
    them is what an error about it must name."""
    return {name for key in path if isinstance(key, str) for name in (key, camel(key))}
