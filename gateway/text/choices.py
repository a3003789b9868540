"""One choice's text as its tokens arrive: detokenization, stop strings, logprobs, finish.

Tokens are taken one at a time, so a stop string ends the choice at the token that completes
it even when the engine delivered several tokens in one event; the tokens after it are never
counted or shown.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.protocol import GenerateChoice
from gateway.text.detokenizer import Detokenizer
from gateway.text.stop_strings import StopStringFilter

# The engine renders token ids as "token_id:<id>" in logprobs (vLLM's tokens-only convention).
_TOKEN_ID_PREFIX = "token_id:"


@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]  # (token id, logprob), most likely first


@dataclass
class ChoiceDelta:
    """What one choice gained from one engine event."""

    index: int
    text: str
    num_tokens: int
    logprobs: list[TokenLogprob] | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None


def parse_token_id(token: str) -> int:
    if token.startswith(_TOKEN_ID_PREFIX):
        return int(token[len(_TOKEN_ID_PREFIX) :])
    raise ValueError("not a token_id:<id> token")


class ChoiceState:
    def __init__(
        self,
        index: int,
        detokenizer: Detokenizer,
        stops: StopStringFilter,
        *,
        want_logprobs: bool,
    ) -> None:
        self.index = index
        self._detokenizer = detokenizer
        self._stops = stops
        self._want_logprobs = want_logprobs
        self.num_tokens = 0
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None
        # Ended on a stop string while the engine was still generating it (abort the engine).
        self.is_cut_short = False

    @property
    def is_finished(self) -> bool:
        return self.finish_reason is not None

    def feed(self, choice: GenerateChoice) -> ChoiceDelta | None:
        if self.is_finished:
            return None
        pieces: list[str] = []
        logprobs: list[TokenLogprob] | None = [] if self._want_logprobs else None
        content = choice.logprobs.content if choice.logprobs is not None else []
        num_new = 0
        for position, token_id in enumerate(choice.token_ids):
            num_new += 1
            pieces.append(self._stops.push(self._detokenizer.add(token_id)))
            if logprobs is not None and position < len(content):
                entry = content[position]
                logprobs.append(
                    TokenLogprob(
                        token_id=token_id,
                        logprob=entry.logprob,
                        top=tuple((parse_token_id(t.token), t.logprob) for t in entry.top_logprobs),
                    )
                )
            if self._stops.hit is not None:
                self._finish("stop", self._stops.hit.stop)
                last = position == len(choice.token_ids) - 1
                self.is_cut_short = choice.finish_reason is None or not last
                break
        if not self.is_finished and choice.finish_reason is not None:
            pieces.append(self._stops.push(self._detokenizer.finish()))
            if self._stops.hit is not None:
                self._finish("stop", self._stops.hit.stop)
            else:
                pieces.append(self._stops.flush())
                self._finish(choice.finish_reason, choice.stop_reason)
        self.num_tokens += num_new
        text = "".join(pieces)
        if not text and num_new == 0 and not self.is_finished:
            return None
        return ChoiceDelta(
            index=self.index,
            text=text,
            num_tokens=num_new,
            logprobs=logprobs,
            finish_reason=self.finish_reason,
            stop_reason=self.stop_reason,
        )

    def end(self, reason: str) -> ChoiceDelta | None:
        """Finish a choice the engine will not finish (its stream ended or failed)."""
        if self.is_finished:
            return None
        self._finish(reason, None)
        return ChoiceDelta(
            index=self.index, text="", num_tokens=0, finish_reason=reason, stop_reason=None
        )

    def _finish(self, reason: str, stop_reason: str | int | None) -> None:
        self.finish_reason = reason
        self.stop_reason = stop_reason
