"""Fetch an adapter's bundle from the gateway's internal endpoint (docs/tokens-api.md):
`GET <source>/internal/v1/adapters/<id>` with the engine token, the bundle streamed back.

Standard library only (http.client through urllib): the loragate engine and vLLM's resolver
plugin, in a venv of its own, run the same code. A body cut short of its Content-Length is a
truncated transfer and refused here; its hash is checked by the caller (FetchedAdapters) before
anything is unpacked.
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Protocol

from lora.adapter_format.bundle import CHUNK
from lora.errors import AdapterFetchError, AdapterNotFoundError

INTERNAL_PATH = "/internal/v1/adapters/"
SHA_HEADER = "x-loragate-sha256"


class BundleFetcher(Protocol):
    def fetch(self, adapter_id: str, out: BinaryIO, *, max_bytes: int) -> str | None:
        """Write the adapter's bundle to `out` (at most `max_bytes`); return the hash the
        store records for it (None if it does not say). AdapterFetchError if the store fails
        or the transfer is cut short; AdapterNotFoundError if the store has no such adapter."""
        ...


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect is an error: urllib would send the engine token on to wherever it points."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirects)


def _error_message(body: bytes) -> str:
    try:
        message = json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return ""
    return str(message)[:300]


@dataclass(frozen=True)
class HttpBundleFetcher:
    """`base_url`: the gateway (any replica, or the Service in front of them)."""

    base_url: str
    token: str | None = field(repr=False)
    timeout_s: float = 60.0

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError("the adapter source must be an http:// or https:// URL")

    def url(self, adapter_id: str) -> str:
        return self.base_url.rstrip("/") + INTERNAL_PATH + urllib.parse.quote(adapter_id, safe="")

    def fetch(self, adapter_id: str, out: BinaryIO, *, max_bytes: int) -> str | None:
        headers = {"authorization": f"Bearer {self.token}"} if self.token else {}
        request = urllib.request.Request(self.url(adapter_id), headers=headers)
        try:
            with _OPENER.open(request, timeout=self.timeout_s) as response:
                return self._copy(response, out, max_bytes=max_bytes)
        except urllib.error.HTTPError as exc:
            message = _error_message(exc.read(4096))
            if exc.code == 404:
                raise AdapterNotFoundError(
                    f"the adapter store has no adapter {adapter_id[:80]!r}", param="lora_name"
                ) from None
            raise AdapterFetchError(
                f"the adapter store answered {exc.code} for adapter {adapter_id[:80]!r}"
                + (f": {message}" if message else ""),
                param="lora_name",
            ) from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            raise AdapterFetchError(
                f"the adapter store could not be reached ({type(exc).__name__})", param="lora_name"
            ) from None

    @staticmethod
    def _copy(response: http.client.HTTPResponse, out: BinaryIO, *, max_bytes: int) -> str | None:
        declared = response.headers.get("content-length")
        if declared is not None and int(declared) > max_bytes:
            raise AdapterFetchError(
                f"the adapter bundle is {declared} bytes, over this engine's {max_bytes}",
                param="lora_name",
            )
        received = 0
        try:
            while chunk := response.read(CHUNK):
                received += len(chunk)
                if received > max_bytes:
                    raise AdapterFetchError(
                        f"the adapter bundle exceeds this engine's {max_bytes} bytes",
                        param="lora_name",
                    )
                out.write(chunk)
        except http.client.IncompleteRead:
            raise AdapterFetchError(
                "the adapter bundle was truncated in transfer; refused", param="lora_name"
            ) from None
        if declared is not None and received != int(declared):
            raise AdapterFetchError(
                f"the adapter bundle was truncated in transfer ({received} of {declared} "
                "bytes); refused",
                param="lora_name",
            )
        return response.headers.get(SHA_HEADER)
