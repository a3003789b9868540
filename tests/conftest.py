"""Test-wide setup. TRITON_INTERPRET must be set before any kernel module is imported."""

from __future__ import annotations

import os
import tempfile

# Triton kernels run on CPU only through the interpreter; it is read when triton loads.
os.environ.setdefault("TRITON_INTERPRET", "1")
# Tests never reach a model hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One tuning file per test run (engine/step/choices): the run's first engine start times the
# native paths and later starts read them, as a deployment's do; a file an earlier run left
# (timed under whatever load it had) never decides this run's paths. The gateway's embedded
# engine reads the variable; `loragate engine` processes get it as --tuning-file
# (tests/gateway/engine_processes.py).
os.environ.setdefault(
    "LORAGATE_ENGINE__TUNING_FILE",
    os.path.join(tempfile.mkdtemp(prefix="loragate-tuning-"), "tuning.json"),
)

from collections.abc import Callable
from pathlib import Path

import pytest

ModelFactory = Callable[..., Path]


@pytest.fixture(scope="session")
def model_factory(tmp_path_factory: pytest.TempPathFactory) -> ModelFactory:
    """Build (once per session) a generated checkpoint: factory(family="llama", tie=False)."""
    from engine.make_model import make_model

    built: dict[tuple[str, str, bool], Path] = {}

    def factory(*, size: str = "tiny", family: str = "llama", tie: bool = False) -> Path:
        key = (size, family, tie)
        if key not in built:
            out = tmp_path_factory.mktemp(f"{size}-{family}{'-tied' if tie else ''}")
            built[key] = make_model(out, size=size, family=family, tie_word_embeddings=tie)
        return built[key]

    return factory


@pytest.fixture(scope="session")
def tiny_model_dir(model_factory: ModelFactory) -> Path:
    return model_factory()


# ---- shared service fixtures (Redis, PostgreSQL): tests/services.py ------------------------------
import sys as _sys  # noqa: E402

_sys.path.insert(0, str(Path(__file__).parent))
from services import (  # noqa: E402, F401
    killable_postgres,
    killable_redis,
    postgres_server_url,
    postgres_url,
    redis_prefix,
    redis_server_url,
)
from vllm_servers import vllm_servers  # noqa: E402, F401
