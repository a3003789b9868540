"""A serving process's garbage collector (gateway/app.py tune_gc_for_serving): start-up's objects
frozen out of full collections, and the young generation's threshold raised. Run in a fresh
interpreter: freezing is for the whole process."""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = """
import gc, json
import gateway.app  # the gateway's imports: what a serving process holds after start-up
from gateway.app import YOUNG_GC_THRESHOLD, tune_gc_for_serving

before = len(gc.get_objects())
tune_gc_for_serving()
young = [object() for _ in range(10)]  # made after: a full collection still sees these
print(json.dumps({
    "before": before,
    "frozen": gc.get_freeze_count(),
    "visited": len(gc.get_objects()),
    "threshold": gc.get_threshold(),
    "young": YOUNG_GC_THRESHOLD,
}))
"""


def test_start_up_objects_leave_the_collector_s_passes() -> None:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True
    ).stdout
    report = json.loads(out.strip().splitlines()[-1])
    assert report["before"] > 100_000  # the libraries: what full collections used to walk
    assert report["frozen"] >= report["before"] * 0.9
    assert report["visited"] < report["before"] / 20  # only what came after start-up
    assert report["threshold"][0] == report["young"] == 10_000
