"""bench/latency.py's wait for an idle machine before each request: it polls the CPUs' busy
share until it drops under the threshold, and gives up at its limit."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH_DIR = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def latency() -> ModuleType:
    # bench/ holds scripts that import each other by name: load latency.py with its directory
    # on the path.
    sys.path.insert(0, str(BENCH_DIR))
    try:
        spec = importlib.util.spec_from_file_location("bench_latency", BENCH_DIR / "latency.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH_DIR))
    return module


def test_the_busy_share_is_a_share(latency: ModuleType) -> None:
    share = latency.cpu_busy_share(0.05)
    if share is None:
        pytest.skip("no /proc/stat on this system: the bench falls back to its fixed pause")
    assert 0.0 <= share <= 1.0


def test_it_waits_until_the_machine_is_idle(
    latency: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    readings = iter([0.5, 0.4, 0.05, 0.9])
    polled: list[float] = []

    def share(window_s: float) -> float:
        polled.append(window_s)
        return next(readings)

    monkeypatch.setattr(latency, "cpu_busy_share", share)
    latency.wait_idle(max_s=60.0)
    assert len(polled) == 3  # stopped at the first reading under 10%, not at the limit


def test_it_gives_up_at_its_limit(latency: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    polled: list[float] = []
    monkeypatch.setattr(latency, "cpu_busy_share", lambda window_s: polled.append(1) or 1.0)
    assert latency.wait_idle(max_s=0.0) >= 0.0 and polled == []  # no time left: no poll
