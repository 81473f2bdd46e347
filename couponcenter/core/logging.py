"""Log lines: plain text (the default) or structured JSON (``LOG_JSON=1``). Either way one
record is one line, whatever the logged values hold: a value that carries a newline (a
``biz_id`` from a client) cannot forge a record of its own."""

import json
import logging
import re
from datetime import UTC, datetime

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}
# What may break a line or drive a terminal (C0, DEL, C1, the Unicode line and paragraph
# separators), and lone surrogates, which the stream's UTF-8 encoder refuses (the record would be
# lost).
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")
_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(match: re.Match) -> str:
    char = match.group()
    if char in _SHORT:
        return _SHORT[char]
    return f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}"


class PlainFormatter(logging.Formatter):
    """``logging.Formatter``, with every control character of the finished record written as its
    escape (``\\n``, ``\\x1b``, ``\\u2028``): the message's values, and a traceback too, stay
    on the record's line."""

    def format(self, record: logging.LogRecord) -> str:
        return _UNPRINTABLE.sub(_escaped, super().format(record))


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``json.dumps`` escapes every control character (and, ASCII
    only, every line separator and lone surrogate) inside its strings."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update({k: v for k, v in vars(record).items() if k not in _STANDARD})
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class ExpectedConflict(logging.Filter):
    """A 409 is a business answer the client expects (sold out, not open yet, a key in use),
    not a problem of the service: logged at ``level``, where Django logs it as a WARNING (during
    a sale, one per refused claim): ``django.request`` at DEBUG, the development server's access
    log (``django.server``) at INFO, as its other lines."""

    def __init__(self, level: str = "DEBUG") -> None:
        super().__init__()
        self.level = logging.getLevelName(level)

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "status_code", None) != 409:
            return True
        record.levelno, record.levelname = self.level, logging.getLevelName(self.level)
        # The logger let it through as a WARNING: ask again for its new level.
        return logging.getLogger(record.name).isEnabledFor(self.level)


class AsWarning(logging.Filter):
    """Log the record as a WARNING without its traceback: for events that are the client's fault
    (a body over the size limit), which Django logs as errors with a traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        record.exc_info = record.exc_text = None
        return True
