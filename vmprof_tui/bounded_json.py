"""JSON from files a user or a guest may have crafted: parsed with limits, then its shape checked before use.

Every reader of untrusted JSON (recording chunks, model, counts and costs files) goes through `loads`: it
refuses NaN/Infinity, more than `max_bytes`, and nesting deeper than `max_depth` (a 100,000-deep array would
otherwise surface as a RecursionError from the parser or from the code that walks it).  `expect` checks the
parsed value's type with a message that names what was read.
"""

from __future__ import annotations

import json
import math
from typing import Any

MAX_DEPTH = 32  # the formats read this way nest at most 5 levels
MAX_BYTES = 1 << 30


class JSONLimitError(ValueError):
    """Not JSON, or JSON beyond the limits: the message says which (one line)."""


def _reject_constant(name: str) -> Any:
    raise JSONLimitError(f"{name} is not a finite number")


def depth_of(value: Any, limit: int) -> int:
    """How deep a parsed value's lists and objects nest, counted without recursion; counting stops past `limit`
    (walking the parsed containers costs far less than scanning the text: strings are most of it)."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        v, d = todo.pop()
        if isinstance(v, dict):
            v = v.values()
        elif not isinstance(v, list):
            continue
        deepest = max(deepest, d)
        if deepest > limit:
            break
        todo.extend((x, d + 1) for x in v if isinstance(x, (dict, list)))
    return deepest


def loads(text: bytes | str, what: str, max_depth: int = MAX_DEPTH, max_bytes: int = MAX_BYTES) -> Any:
    """The value of JSON text; JSONLimitError naming `what` when it is not JSON or is beyond the limits."""
    if len(text) > max_bytes:
        raise JSONLimitError(f"{what} is {len(text)} bytes, over the limit of {max_bytes}")
    try:
        value = json.loads(text, parse_constant=_reject_constant)
    except JSONLimitError as e:
        raise JSONLimitError(f"{what}: {e}") from None
    except RecursionError:  # the parser's own limit (about 1,000 levels)
        raise JSONLimitError(f"{what} nests deeper than {max_depth} levels") from None
    except ValueError as e:  # JSONDecodeError, bad UTF-8
        raise JSONLimitError(f"{what} is not JSON ({str(e).splitlines()[0][:120]})") from None
    # a value nests no deeper than the text has brackets (those in strings counted too): most texts, a table
    # chunk's header of a dozen fields, need no walk
    opening = text.count(b"[") + text.count(b"{") if isinstance(text, bytes) else text.count("[") + text.count("{")
    if opening > max_depth and depth_of(value, max_depth) > max_depth:
        raise JSONLimitError(f"{what} nests deeper than {max_depth} levels")
    return value


_NAMES = {dict: "an object", list: "an array", str: "a string", int: "a number", float: "a number",
          bool: "true/false", type(None): "null"}


def expect(value: Any, kind: type | tuple[type, ...], what: str) -> Any:
    """`value` when it is of `kind` (a bool is not a number here), else JSONLimitError naming what it is."""
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        wanted = " or ".join(dict.fromkeys(_NAMES.get(k, k.__name__) for k in kinds))
        raise JSONLimitError(f"{what} is {_NAMES.get(type(value), type(value).__name__)}, not {wanted}")
    return value


def number(value: Any, what: str, lo: float = -math.inf, hi: float = math.inf) -> float:
    """`value` as a finite number in [lo, hi], else JSONLimitError."""
    v = float(expect(value, (int, float), what))
    if not (math.isfinite(v) and lo <= v <= hi):
        raise JSONLimitError(f"{what} is {value!r}, not between {lo:g} and {hi:g}")
    return v
