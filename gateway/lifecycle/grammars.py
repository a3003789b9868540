"""Every output constraint checked in full before anything is reserved, off the event loop.

Planning runs the engine's cheap checks (one constraint, its JSON parses, sizes); this one runs
the grammar itself through llguidance (schema features, regex and grammar syntax, its size
limits), ~1 ms for a typical schema and up to about a second for a megabyte of one, through the
engine client (`check_constraint`: the in-process engine compiles it, yielding a core of its
step meanwhile, and keeps it for the request; in front of HTTP engines, a worker thread). A
refusal is a 400 naming the client's field, before admission: nothing is reserved or billed,
the engine never sees the request. Results are kept (by a digest of the spec, bounded) so a
schema sent again is checked once.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from engine.protocol import InvalidRequestError, StructuredSpec, to_structured_spec
from gateway.lifecycle.job import Plan
from tenancy.errors import BadRequest


class GrammarChecks:
    def __init__(
        self, check: Callable[[StructuredSpec], Awaitable[None]], max_entries: int = 1024
    ) -> None:
        """`check`: the engine client's check_constraint (raises InvalidRequestError)."""
        self._check = check
        self._max_entries = max_entries
        self._results: OrderedDict[bytes, InvalidRequestError | None] = OrderedDict()

    async def check(self, plan: Plan) -> None:
        """Raise BadRequest (naming plan.grammar_param, else the engine's field) for the first
        constraint llguidance refuses."""
        for request in plan.requests:
            wire = request.sampling_params.structured_outputs
            if wire is None:
                continue
            try:
                spec = to_structured_spec(wire)
                key = hashlib.sha256(repr(spec).encode()).digest()
                if key in self._results:
                    self._results.move_to_end(key)
                    error = self._results[key]
                else:
                    error = await self._refusal(spec)
                    self._results[key] = error
                    while len(self._results) > self._max_entries:
                        self._results.popitem(last=False)
            except InvalidRequestError as exc:
                error = exc
            if error is not None:
                raise _client_error(error, plan.grammar_param)

    async def _refusal(self, spec: StructuredSpec) -> InvalidRequestError | None:
        try:
            await self._check(spec)
        except InvalidRequestError as exc:
            return exc
        return None


def _client_error(
    error: InvalidRequestError, client_param: Callable[[str], str] | None
) -> BadRequest:
    if client_param is None or error.param is None:
        return BadRequest(error.message, param=error.param)
    param = client_param(error.param)
    return BadRequest(error.message.replace(error.param, param, 1), param=param)
