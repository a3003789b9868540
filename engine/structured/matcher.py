"""A compiled grammar and one sequence's walk through it.

A `CompiledGrammar` holds a pristine llguidance matcher that nothing ever advances; each
sequence walks its own deep copy (a few microseconds against ~1 ms for a compile), so one
compile serves every request, and every tenant, that asks for the same spec, and no sequence
can see or change another's state.

Invariant: a sequence's matcher has consumed exactly its output tokens, in order. Preemption
in this engine recomputes the KV cache but keeps the sampled tokens, so the matcher needs no
rollback there; a sequence that finishes drops its matcher with it.
"""

from __future__ import annotations

import llguidance

from engine.structured.spec import StructuredSpec


class GrammarMatcher:
    """One sequence's position in its grammar."""

    def __init__(self, matcher: llguidance.LLMatcher) -> None:
        self.matcher = matcher  # masks.py fills bitmasks from it

    def accept(self, token_id: int) -> bool:
        """Advance by one sampled token; False when the grammar does not allow it (the mask
        was not applied, or the matcher is in error)."""
        ok: bool = self.matcher.consume_token(token_id)
        return ok

    @property
    def is_stopped(self) -> bool:
        """The grammar is complete and allows nothing more: the sequence ends here."""
        stopped: bool = self.matcher.is_stopped()
        return stopped

    @property
    def error(self) -> str | None:
        """Why the matcher failed (a step past llguidance's per-step limits, say), or None."""
        return self.matcher.get_error() if self.matcher.is_error() else None


class CompiledGrammar:
    def __init__(self, spec: StructuredSpec, pristine: llguidance.LLMatcher) -> None:
        self.spec = spec
        self._pristine = pristine

    def new_matcher(self) -> GrammarMatcher:
        return GrammarMatcher(self._pristine.deep_copy())
