"""One measured cell of the results table: a system on a workload at one batch size."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class SystemResult:
    system: str  # "loragate" | "transformers"
    batch_size: int  # transformers: the static batch; loragate: max_num_seqs
    num_requests: int  # requests actually run (a prefix of the workload when subsampled)
    num_requests_total: int
    num_useful_tokens: int  # each request's own output tokens
    num_generated_tokens: int  # including tokens generated past a request's own length
    elapsed_s: float

    @property
    def tokens_per_s(self) -> float:
        return self.num_useful_tokens / self.elapsed_s

    @property
    def is_subsampled(self) -> bool:
        return self.num_requests < self.num_requests_total

    def to_json(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "tokens_per_s": self.tokens_per_s,
            "is_subsampled": self.is_subsampled,
        }
