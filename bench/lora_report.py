"""The LoRA benchmark's cells (one system on one setting, timed) and how they are reported:
the printed table and the goal ratios."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Cell:
    name: str
    system: str  # loragate | peft
    setting: str
    num_requests: int
    num_requests_total: int
    num_tokens: int  # useful tokens (each request's own output)
    wall_s: float
    cpu_s: float
    extra: dict[str, Any] = field(default_factory=dict)  # engine batch sizes, cache counters

    @property
    def tokens_per_s(self) -> float:
        return self.num_tokens / self.wall_s

    @property
    def tokens_per_cpu_s(self) -> float:
        return self.num_tokens / self.cpu_s


def format_cells(cells: Sequence[Cell], reference: Cell) -> str:
    header = ("run", "system", "setting", "requests", "tok/s", "tok/cpu-s", "vs LoRA (cpu)",
              "mean batch", "steps (decode bound)")  # fmt: skip
    rows = [header]
    for c in cells:
        requests = str(c.num_requests)
        if c.num_requests < c.num_requests_total:
            requests = f"first {c.num_requests} of {c.num_requests_total}"
        ratio = c.tokens_per_cpu_s / reference.tokens_per_cpu_s
        batch, steps = "", ""
        if "num_steps" in c.extra:
            batch = f"{c.extra['mean_batch']:.1f}"
            steps = f"{c.extra['num_steps']} (>= {c.extra['decode_step_bound']})"
        rows.append((c.name, c.system, c.setting, requests, f"{c.tokens_per_s:.1f}",
                     f"{c.tokens_per_cpu_s:.1f}", f"{ratio:.2f}x", batch, steps))  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def ratios(
    base: Cell, lora: Cell, mixed: Cell, seq: Cell, s1: Cell, sn: Cell, *, cpu: bool
) -> dict[str, float]:
    def rate(c: Cell) -> float:
        return c.tokens_per_cpu_s if cpu else c.tokens_per_s

    return {
        "lora_overhead": rate(base) / rate(lora),  # = LoRA time / base time, same tokens
        "vs_peft_mixed": rate(lora) / rate(mixed),
        "vs_peft_sequential": rate(lora) / rate(seq),
        "scaling_loss_1_to_1000": 1 - rate(sn) / rate(s1),
    }
