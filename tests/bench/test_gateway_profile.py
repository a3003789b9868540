"""bench/gateway_profile.py: py-spy's raw output read into self time by frame and by area
(bench/gateway_profile_report.py), and a process's CPU time read from /proc."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
ROOT = Path("/src/loragate")

RAW = f"""\
<module> (loragate:8);run (asyncio/runners.py:118) 5
<module> (loragate:8);serve ({ROOT}/gateway/lifecycle/service.py:40);admit (/x/lib/python3.11/site-packages/tenancy/quota/redis_store.py:88) 3
<module> (loragate:8);send (/venv/lib/python3.11/site-packages/uvicorn/protocols/http/httptools_impl.py:500) 2
<module> (loragate:8);loads (/usr/lib/python3.11/json/__init__.py:346) 1
<module> (loragate:8);<native frame without a file> 1
not a sample line
"""


def test_raw_profile_is_read_into_self_time_by_frame_and_area(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.syspath_prepend(str(BENCH))
    import gateway_profile_report as report

    prof = report.aggregate_raw(RAW, root=ROOT, top=3)
    assert prof["samples"] == 12
    assert prof["top_frames"] == [
        ["run (asyncio/runners.py)", 41.7],
        ["admit (tenancy/quota/redis_store.py)", 25.0],
        ["send (uvicorn/protocols/http/httptools_impl.py)", 16.7],
    ]
    areas = dict(prof["areas"])
    # Only the innermost frame counts: the lifecycle frame above admit() has no self time.
    assert "gateway/lifecycle" not in areas
    assert areas["tenancy/quota"] == 25.0
    assert areas["uvicorn"] == 16.7
    assert areas["json"] == 8.3  # a standard-library package by its name
    assert areas["other"] == 8.3  # a frame py-spy gave no file for
    with pytest.raises(ValueError, match="no samples"):
        report.aggregate_raw("nothing here\n", root=ROOT)


def test_cpu_seconds_of_a_process_grow_with_its_work(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCH))
    import gateway_profile

    before = gateway_profile.cpu_seconds(os.getpid())
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:  # burn CPU: /proc counts it in clock ticks
        pass
    assert gateway_profile.cpu_seconds(os.getpid()) >= before + 0.2
    assert gateway_profile.cpu_seconds(2**22 + 12345) == 0.0  # no such process
