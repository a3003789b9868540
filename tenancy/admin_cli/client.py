"""A small synchronous client of the admin REST API, as the CLI uses it: one base URL, one
bearer key, errors raised with what the server said (its message, the field it names, its code
and the HTTP status), never a traceback."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

API = "/admin/v1"
TIMEOUT_S = 60.0


@dataclass
class AdminApiError(Exception):
    status: int
    message: str
    code: str | None = None
    param: str | None = None

    def __str__(self) -> str:
        where = f" (field: {self.param})" if self.param else ""
        code = f", {self.code}" if self.code else ""
        return f"{self.message}{where} [HTTP {self.status}{code}]"


@dataclass
class ConnectionFailed(Exception):
    url: str
    reason: str

    def __str__(self) -> str:
        return f"cannot reach {self.url}: {self.reason}"


def _error(response: httpx.Response) -> AdminApiError:
    try:
        body = response.json().get("error", {})
    except ValueError:
        body = {}
    if not isinstance(body, dict):
        body = {}
    return AdminApiError(
        status=response.status_code,
        message=str(body.get("message") or response.reason_phrase or "request failed"),
        code=body.get("code"),
        param=body.get("param"),
    )


class AdminClient:
    def __init__(self, url: str, key: str, *, transport: httpx.BaseTransport | None = None) -> None:
        self.url = url.rstrip("/")
        self._http = httpx.Client(
            base_url=self.url + API,
            headers={"authorization": f"Bearer {key}", "user-agent": "loragate-admin-cli"},
            timeout=TIMEOUT_S,
            transport=transport,
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(
        self,
        method: str,
        path: str,
        *,
        json: object = None,
        params: Mapping[str, Any] | None = None,
        content: Iterator[bytes] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Any:
        """The answer's JSON (None for 204); AdminApiError for any 4xx/5xx."""
        query = {k: v for k, v in (params or {}).items() if v is not None}
        try:
            response = self._http.request(
                method, path, json=json, params=query, content=content, headers=headers
            )
        except httpx.HTTPError as exc:
            raise ConnectionFailed(self.url, type(exc).__name__) from None
        if response.status_code >= 400:
            raise _error(response)
        return None if response.status_code == 204 or not response.content else response.json()
