"""A small synchronous client of the REST API, for ``cdcflow cli``."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from cdcflow.core.errors import CdcflowError, NotAvailableError

__all__ = ["ApiClient", "ApiError"]


class ApiError(CdcflowError):
    """The server answered with an error (``error_code`` / ``error_msg``)."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        self.status = status
        self.error_code = str(body.get("error_code", "ErrInternal"))
        super().__init__(str(body.get("error_msg", "unknown error")), detail=body)

    @property
    def code_name(self) -> str:
        return self.error_code

    def __str__(self) -> str:
        return f"[{self.error_code}] {self.message}"


class ApiClient:
    def __init__(self, server: str, timeout: float = 30.0) -> None:
        self.base = server if "://" in server else f"http://{server}"
        self.timeout = timeout

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            self.base.rstrip("/") + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                doc = json.loads(raw)
            except ValueError:
                doc = {"error_code": "ErrInternal", "error_msg": raw.decode(errors="replace") or str(exc)}
            raise ApiError(exc.code, doc) from None
        except (urllib.error.URLError, OSError) as exc:
            raise NotAvailableError(f"cannot reach the cdcflow server at {self.base}: {exc}") from None
        return json.loads(raw) if raw else {}
