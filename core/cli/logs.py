"""How the ``cdcflow`` command logs: ``--log-format text`` (the default, one readable line
per record) or ``--log-format json`` (one JSON object per line, for log shippers).

A JSON line has ``ts`` (UTC, ISO 8601 with milliseconds), ``level``, ``logger`` and
``message``; ``changefeed`` when the record names one (``extra={"changefeed": ...}``,
or a message that starts with ``changefeed <id>`` or ``maintainer of <id>``, as
cdcflow's own do); ``error_code`` and ``error`` (the numeric code and its name, e.g.
1001 and ``ErrConfigInvalid``) when a :class:`~cdcflow.core.errors.CdcflowError` is
logged, as the exception or as an argument of the message; ``exception`` with the
traceback when one is attached.
"""

from __future__ import annotations

import json
import logging
import re
import time
from typing import Any

from cdcflow.core.errors import CdcflowError

__all__ = ["LOG_FORMATS", "JsonFormatter", "configure_logging"]

LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_CHANGEFEED = re.compile(r"^(?:changefeed|maintainer of) ([A-Za-z0-9]+(?:-[A-Za-z0-9]+)*)\b")


def _error_of(record: logging.LogRecord) -> CdcflowError | None:
    if record.exc_info and isinstance(record.exc_info[1], CdcflowError):
        return record.exc_info[1]
    args = record.args if isinstance(record.args, tuple) else (record.args,) if record.args else ()
    return next((a for a in args if isinstance(a, CdcflowError)), None)


class JsonFormatter(logging.Formatter):
    """One JSON object per record; see the module docstring for the fields."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        doc: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": message,
        }
        changefeed = getattr(record, "changefeed", None) or getattr(record, "changefeed_id", None)
        if changefeed is None:
            match = _CHANGEFEED.match(message)
            changefeed = match.group(1) if match else None
        if changefeed is not None:
            doc["changefeed"] = str(changefeed)
        error = _error_of(record)
        if error is not None:
            if error.code is not None:
                doc["error_code"] = int(error.code)
            doc["error"] = error.code_name
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, ensure_ascii=False, default=str)


def configure_logging(level: str, log_format: str = "text") -> None:
    """Log to stderr at ``level`` in ``log_format`` (``text`` or ``json``)."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
