"""GET /internal/v1/adapters/{adapter_id}: an adapter version's bundle, for engines only.

Engines fetch what they are asked to load from here (lora/remote/fetch.py; vLLM through its
resolver plugin), so they need the gateway's URL and nothing else: every replica serves every
adapter from the store (tenancy/adapters/store.py). The caller must present the engine token
(`LORAGATE_ENGINE_ADMIN_TOKEN`, the secret the gateway already sends engines); engines are
trusted with every tenant's adapters, so the id alone selects one. No API key opens it, an
admin's included: unset, the route answers 401 to everyone. The body streams with its
Content-Length and the hash the store records, which the engine checks before unpacking.
"""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import APIRouter, Depends, Header
from starlette.responses import StreamingResponse

from gateway.deps import StateDep
from tenancy.errors import InvalidApiKey, NotFound

router = APIRouter(tags=["internal"])

SHA_HEADER = "x-loragate-sha256"  # what lora/remote/fetch.py reads
_LABEL = b"loragate-engine-token"


async def require_engine_token(
    state: StateDep, authorization: Annotated[str | None, Header()] = None
) -> None:
    """401 (the API-key shape, one message) unless the bearer token is the engine token.
    Digests first: the comparison takes the same time whatever the presented length."""
    token = state.settings.engine_admin_token
    scheme, _, presented = (authorization or "").partition(" ")
    if token is None or scheme.lower() != "bearer":
        raise InvalidApiKey()
    expected = hmac.new(_LABEL, token.get_secret_value().encode(), "sha256").digest()
    given = hmac.new(_LABEL, presented.strip().encode("utf-8", "replace"), "sha256").digest()
    if not hmac.compare_digest(expected, given):
        raise InvalidApiKey()


@router.get("/internal/v1/adapters/{adapter_id}", dependencies=[Depends(require_engine_token)])
async def adapter_bundle(adapter_id: str, state: StateDep) -> StreamingResponse:
    tenancy = state.tenancy
    bundle = await tenancy.adapters.open_bundle(tenancy.sessionmaker, adapter_id[:64])
    if bundle is None:
        raise NotFound("Adapter")
    return StreamingResponse(
        bundle.chunks,
        media_type="application/x-tar",
        headers={
            "content-length": str(bundle.size_bytes),
            SHA_HEADER: bundle.sha256,
            "cache-control": "no-store",
        },
    )
