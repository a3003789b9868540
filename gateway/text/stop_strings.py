"""Stop strings over a stream of text pieces, found wherever token boundaries fall.

The text that could still be the start of a stop string (the longest suffix that is a proper
prefix of one) is held back, so a client never receives part of a stop string that a later token
completes, and nothing else waits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class StopHit:
    stop: str  # the stop string that matched (OpenAI/vLLM `stop_reason`)


class StopStringFilter:
    """Feed text pieces in order; `push` returns what may be released now."""

    def __init__(self, stops: Sequence[str], *, include_stop: bool = False) -> None:
        self._stops = tuple(s for s in stops if s)
        self._include_stop = include_stop
        self._longest = max((len(s) for s in self._stops), default=0)
        self._text = ""  # everything seen (up to the stop, once one matched)
        self._released = 0  # characters of _text already returned
        self.hit: StopHit | None = None

    def push(self, piece: str) -> str:
        if self.hit is not None or not piece:
            return ""
        if not self._stops:
            return piece
        start = max(0, len(self._text) - self._longest + 1)
        self._text += piece
        found = self._find(start)
        if found is not None:
            position, stop = found
            self.hit = StopHit(stop)
            end = position + len(stop) if self._include_stop else position
            self._text = self._text[:end]
            return self._release(end)
        return self._release(len(self._text) - self._held_back())

    def flush(self) -> str:
        """At the end of generation nothing can complete a stop string any more."""
        return self._release(len(self._text))

    def _find(self, start: int) -> tuple[int, str] | None:
        best: tuple[int, str] | None = None
        for stop in self._stops:
            position = self._text.find(stop, start)
            if position >= 0 and (best is None or position < best[0]):
                best = (position, stop)
        return best

    def _held_back(self) -> int:
        text, last = self._text, self._text[-1]
        held = 0
        for stop in self._stops:
            for size in range(min(len(stop) - 1, len(text)), held, -1):
                if stop[size - 1] == last and text.endswith(stop[:size]):
                    held = size
                    break
        return held

    def _release(self, end: int) -> str:
        end = min(end, len(self._text))
        if end <= self._released:
            return ""
        out = self._text[self._released : end]
        self._released = end
        return out
