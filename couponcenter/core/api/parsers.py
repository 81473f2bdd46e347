"""JSON parsing that turns every malformed body into a 400, never a 500."""

from __future__ import annotations

import io
import re

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser, get_encoding

# Bodies nested deeper are refused: below this, nothing that walks a value recursively later (a
# serializer, Django's lookups at two frames a level, a JSON encoder) comes near Python's
# recursion limit, whatever the stack it runs on. Above any bound a field sets on its own JSON.
MAX_DEPTH = 200
# A lone surrogate reaches the parsed data only through a ``\u`` escape (raw surrogate bytes are
# not valid UTF-8 and fail decoding): a body without such an escape needs no walk.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


class SafeJSONParser(JSONParser):
    """DRF's parser, plus:

    - bodies nested deeper than ``MAX_DEPTH``, including those deeper than the interpreter's
      recursion limit (a ``RecursionError`` from ``json``, which DRF lets through as a server
      error);
    - strings that are not valid Unicode: JSON lets ``"\\ud800"`` stand alone, but such a string
      can be neither encoded as UTF-8 (for a response or a log line) nor stored by PostgreSQL.
      Refused here, for every endpoint and every string of the body, keys included.
    """

    def parse(self, stream, media_type=None, parser_context=None):
        raw = stream.read()
        try:
            data = super().parse(io.BytesIO(raw), media_type, parser_context)
        except RecursionError as exc:
            raise ParseError(_TOO_DEEP) from exc
        # Only a body with more brackets than the bound can be nested past it.
        if raw.count(b"[") + raw.count(b"{") > MAX_DEPTH and not _depth_within(data, MAX_DEPTH):
            raise ParseError(_TOO_DEEP)
        utf8 = get_encoding(parser_context or {}).lower().replace("-", "") == "utf8"
        if not utf8 or _SURROGATE_ESCAPE.search(raw):
            where = _lone_surrogate_at(data)
            if where is not None:
                raise ParseError(f"JSON parse error - not valid Unicode: {where}.")
        return data


_TOO_DEEP = f"JSON parse error - the body is nested too deeply ({MAX_DEPTH} levels at most)."


def _depth_within(data: object, limit: int) -> bool:
    """Whether ``data`` nests at most ``limit`` levels: one level of containers at a time."""
    level = [data] if isinstance(data, dict | list) else []
    for _ in range(limit):
        level = [
            inner
            for item in level
            for inner in (item.values() if type(item) is dict else item)
            if type(inner) is dict or type(inner) is list
        ]
        if not level:
            return True
    return not level


def _lone_surrogate_at(data: object) -> str | None:
    """Where the first string with a lone surrogate is (``"a lone surrogate U+D800 in
    jobs.1.attribute.note"``), or None. Iterative: the data may be nested as deep as ``json``
    allowed."""
    stack: list[tuple[object, str]] = [(data, "")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, dict):
            for key, value in item.items():
                inner = f"{path}.{_printable(key)}" if path else _printable(key)
                if _SURROGATE.search(key):
                    return _described(key, f"the key {inner}")
                stack.append((value, inner))
        elif isinstance(item, list):
            stack.extend(
                (value, f"{path}.{index}" if path else str(index))
                for index, value in enumerate(item)
            )
        elif isinstance(item, str) and _SURROGATE.search(item):
            return _described(item, path or "the body")
    return None


def _described(text: str, where: str) -> str:
    return f"a lone surrogate U+{ord(_SURROGATE.search(text).group()):04X} in {where}"


def _printable(key: str) -> str:
    """The key as it can be written in a message (a surrogate as its ``\\udXXX`` escape)."""
    return key.encode("utf-8", "backslashreplace").decode()
