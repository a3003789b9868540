"""Chaos fixtures: real deployments (gateway processes, engines, Redis, PostgreSQL) and real,
impolite clients. A deployment gets a fresh PostgreSQL database (`postgres_url`, tests/services.py)
and its own Redis key prefix, deleted when it stops.

Run with `pytest tests/chaos` (or `make test-chaos`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# --import-mode=importlib puts no test directory on sys.path; the helper modules live here and
# beside the e2e and gateway tests.
sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "e2e"))
sys.path.insert(0, str(Path(__file__).parent.parent / "gateway"))
from deployment import Deployment, deploy
from engine_processes import EngineProcess, start_engines


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path


@pytest.fixture
def two_engines(tiny_model_dir: Path, workdir: Path) -> Iterator[list[EngineProcess]]:
    """Two `loragate engine` servers (64 sequences each), killed afterwards."""
    engines = start_engines(tiny_model_dir, workdir, 2, "--max-num-seqs", "64")
    try:
        yield engines
    finally:
        for engine in engines:
            engine.kill()


@pytest.fixture
def over_two_engines(
    tiny_model_dir: Path,
    workdir: Path,
    postgres_url: str,
    redis_server_url: str,
    two_engines: list[EngineProcess],
) -> Iterator[Callable[[int], Deployment]]:
    """`make(num_gateways)`: gateway processes in HTTP mode over `two_engines` (stopped after)."""
    started: list[Deployment] = []

    def make(num_gateways: int) -> Deployment:
        started.append(
            deploy(
                tiny_model_dir,
                workdir,
                database_url=postgres_url,
                redis_url=redis_server_url,
                num_gateways=num_gateways,
                engines=two_engines,
            )
        )
        return started[-1]

    yield make
    for deployment in started:
        deployment.stop()
