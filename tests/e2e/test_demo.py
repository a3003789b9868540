"""`make run` (`loragate demo`): prepares a demo tenant and key, serves on the given port, and
the curl line and the OpenAI SDK snippet it prints work exactly as printed."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from gateway_process import BIN, free_port


def _block(text: str, heading: str) -> str:
    """The indented block printed under `heading`, dedented."""
    lines = text.split(heading, 1)[1].splitlines()[1:]
    block = []
    for line in lines:
        if not line.strip():
            if block:
                break
            continue
        block.append(line)
    return textwrap.dedent("\n".join(block))


@pytest.fixture(scope="module")
def demo(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, str, Path]]:
    state = tmp_path_factory.mktemp("demo")
    first = subprocess.run(
        [str(BIN / "loragate"), "demo", "--model", str(tiny_model_dir), "--dir", str(state),
         "--no-serve"],
        capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    old_key = first.stdout.split("shown once", 1)[1].split()[-1]
    port = free_port()
    out_path, err_path = state / "stdout.txt", state / "stderr.txt"
    with open(out_path, "w") as out, open(err_path, "w") as err:
        proc = subprocess.Popen(
            [str(BIN / "loragate"), "demo", "--model", str(tiny_model_dir), "--dir", str(state),
             "--port", str(port)],
            stdout=out, stderr=err,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, err_path.read_text()[-3000:]
            try:
                if httpx.get(f"http://127.0.0.1:{port}/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline
            time.sleep(0.3)
        yield out_path.read_text(), old_key, err_path
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    # The key is printed once, on stdout, for the operator; no log line ever holds it.
    banner = out_path.read_text()
    key = _block(banner, "shown once").split()[-1]
    assert key not in err_path.read_text()
    assert banner.count(key) >= 1


def test_the_printed_curl_line_works(demo: tuple[str, str, Path]) -> None:
    banner, _, _ = demo
    curl = _block(banner, "Try it with curl:")
    assert curl.startswith("curl ")
    done = subprocess.run(["bash", "-c", curl], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    reply = json.loads(done.stdout)
    assert reply["object"] == "chat.completion"
    assert reply["choices"][0]["message"]["content"]


def test_the_printed_sdk_snippet_works(demo: tuple[str, str, Path]) -> None:
    banner, _, _ = demo
    snippet = _block(banner, "Or with the OpenAI SDK (Python):")
    assert "from openai import OpenAI" in snippet
    done = subprocess.run(
        [sys.executable, "-c", snippet], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()


def test_a_restart_revokes_the_previous_demo_key(demo: tuple[str, str, Path]) -> None:
    banner, old_key, _ = demo
    base = _block(banner, "Or with the OpenAI SDK (Python):").split('base_url="')[1].split('"')[0]
    r = httpx.get(base + "/models", headers={"authorization": f"Bearer {old_key}"}, timeout=30)
    assert r.status_code == 401


def test_the_demo_adapters_are_listed_and_usable(demo: tuple[str, str, Path]) -> None:
    banner, _, _ = demo
    snippet = _block(banner, "Or with the OpenAI SDK (Python):")
    base = snippet.split('base_url="')[1].split('"')[0]
    key = snippet.split('api_key="')[1].split('"')[0]
    headers = {"authorization": f"Bearer {key}"}
    models = httpx.get(base + "/models", headers=headers, timeout=30).json()
    assert [m["id"] for m in models["data"]] == ["tiny", "pirate", "poet"]
    for model in ("pirate", "poet"):
        body = {"model": model, "messages": [{"role": "user", "content": "Ahoy"}], "max_tokens": 4}
        r = httpx.post(base + "/chat/completions", json=body, headers=headers, timeout=60)
        assert r.status_code == 200 and r.json()["model"] == model
