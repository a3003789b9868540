"""The engine on a machine without a C++ compiler (CXX names none, PATH has no c++ or g++, the
kernel cache empty): it starts, says so in one warning, and generates on its PyTorch paths the
tokens the engine with the native kernels generates. In a subprocess: what the compiler lookup
finds, and which kernels a process has loaded, are the process's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from tests.engine.engine_helpers import pinned_engine, request, run_to_completion

ROOT = Path(__file__).parents[3]
PROMPT, MAX_TOKENS = [1, 2, 3, 4, 5, 6, 7], 6
# the child: the tiny model in float32, LoRA on (the engine's default), greedy
CHILD = f"""
import json, logging, sys, torch
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
from tests.engine.engine_helpers import pinned_engine, request, run_to_completion
engine = pinned_engine(sys.argv[1], torch.float32)
engine.add_request(request("a", {PROMPT}, max_tokens={MAX_TOKENS}))
print("TOKENS " + json.dumps(run_to_completion(engine).tokens_of("a")))
"""
OURS = ("engine.", "kernels.", "lora.", "gateway.", "tenancy.")


def test_the_engine_runs_without_a_compiler_and_says_so_once(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    env = {
        **os.environ,
        "CXX": str(tmp_path / "no-such-c++"),
        "PATH": str(empty),
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache"),
        "PYTHONPATH": str(ROOT),
    }
    result = subprocess.run(
        [sys.executable, "-c", CHILD, str(tiny_model_dir)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    warnings = [
        line
        for line in result.stderr.splitlines()
        if line.startswith("WARNING ") and line.split()[1].startswith(OURS)
    ]
    assert len(warnings) == 1, "\n".join(warnings)
    assert "no C++ compiler" in warnings[0] and "no-such-c++" in warnings[0]
    assert "PyTorch" in warnings[0]
    assert not (tmp_path / "cache" / "loragate_native").exists()  # nothing was built

    line = next(x for x in result.stdout.splitlines() if x.startswith("TOKENS "))
    tokens = json.loads(line.removeprefix("TOKENS "))
    engine = pinned_engine(tiny_model_dir, torch.float32)  # this process: native kernels
    engine.add_request(request("a", PROMPT, max_tokens=MAX_TOKENS))
    assert tokens == run_to_completion(engine).tokens_of("a")
    assert len(tokens) == MAX_TOKENS
