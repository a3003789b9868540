"""One start-up choice of a native path, and where it came from: the record the start-up log
line, the engine's /metrics (`loragate_engine_startup_choice`) and tests read.

Torch-free: engine/metrics.py, which the gateway's in-process engine imports too, reads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# saved: read from the tuning file (engine/step/choices/tuning.py), nothing timed at this start;
# timed: timed at this start (then saved where there is a tuning file);
# pinned: an engine option named the path; fixed: only one path can run here (the device,
# the dtype, a kernel that did not build), so nothing was timed or read.
Source = Literal["saved", "timed", "pinned", "fixed"]

# The timed choices, by the name the tuning file and the metric give them.
DECODE_ATTENTION = "decode_attention"
PREFILL_ATTENTION = "prefill_attention"
NATIVE_MATMUL = "native_matmul"
PACKED_FLOAT32 = "packed_float32"


@dataclass(frozen=True)
class StartupChoice:
    name: str  # one of the names above
    value: str  # as the tuning file keeps it: "native", "sdpa", "every", "512", "yes", ...
    source: Source
    # saved / timed: the timings behind it; pinned: the option; fixed: why nothing was timed
    detail: str
    path: str | None = None  # the tuning file it was read from or saved to
    timed_at: str | None = None  # when the saved timing was taken (ISO 8601, UTC)

    def origin(self) -> str:
        """Where the value came from, for the start-up log line."""
        if self.source == "saved":
            return f"from {self.path}, timed {self.timed_at}: {self.detail}"
        if self.source == "timed":
            saved = f"; saved to {self.path}" if self.path else "; not saved (no tuning file)"
            return f"timed at this start: {self.detail}{saved}"
        return self.detail
