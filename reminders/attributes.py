"""A timeout job's ``attribute``: the JSON object a caller attaches to a job and gets back when it
fires.

It is bounded in nesting (``TIMEOUT_ATTRIBUTE_MAX_DEPTH``) and in size
(``TIMEOUT_ATTRIBUTE_MAX_BYTES``, measured by ``size``): every later step that walks it
recursively (the database adapter's JSON encoder, the API's renderer, a webhook body) then stays
far from Python's recursion limit. Its strings hold no NUL and no lone surrogate, which
PostgreSQL's ``jsonb`` cannot store. The depth is measured by an iterative walk, before anything
recursive touches the value: what is checked may be nested as deep as the parser allowed.
"""

from __future__ import annotations

import json
import re

from django.conf import settings

_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def size(value: dict) -> int:
    """Bytes of the attribute's JSON as it is stored and sent (ASCII: anything else escaped).
    Only for a value ``check`` passed (a deeper one may exhaust the encoder's recursion)."""
    return len(json.dumps(value))


def check(value: object) -> None:
    """Raises ``ValueError`` saying what is wrong when ``value`` is not an attribute this service
    stores."""
    if not isinstance(value, dict):
        raise ValueError("Must be a JSON object.")
    limit = settings.TIMEOUT_ATTRIBUTE_MAX_DEPTH
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            if depth > limit:
                raise ValueError(f"Must not be nested deeper than {limit} levels.")
            for key, inner in item.items():
                _check_text(key)
                stack.append((inner, depth + 1))
        elif isinstance(item, list):
            if depth > limit:
                raise ValueError(f"Must not be nested deeper than {limit} levels.")
            stack.extend((inner, depth + 1) for inner in item)
        elif isinstance(item, str):
            _check_text(item)
    most = settings.TIMEOUT_ATTRIBUTE_MAX_BYTES
    if size(value) > most:
        raise ValueError(f"Too large ({most} bytes of JSON at most).")


def _check_text(text: str) -> None:
    found = _UNSTORABLE.search(text)
    if found is None:
        return
    if found.group() == "\x00":
        raise ValueError("Must not contain NUL (U+0000) characters.")
    raise ValueError(f"Not valid Unicode: a lone surrogate U+{ord(found.group()):04X}.")
