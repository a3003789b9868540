"""bench/gateway_overhead.py: wrk output parsing (bench/gateway_wrk.py), and (slow) `--quick --json`
end to end."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "gateway_overhead.py"

WRK_OUTPUT = """Running 3s test @ http://127.0.0.1:1/inference/v1/generate
  1 threads and 1 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     1.62ms  410.11us  12.00ms   90.00%
  Latency Distribution
     50%    1.55ms
     75%    1.70ms
     90%    1.90ms
     99%    3.20ms
  1850 requests in 3.00s, 1.30MB read
Requests/sec:    616.52
Transfer/sec:    443.00KB
"""


def test_wrk_output_is_parsed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.syspath_prepend(str(BENCH.parent))
    import gateway_wrk

    class Done:
        stdout = WRK_OUTPUT

    monkeypatch.setattr(gateway_wrk.subprocess, "run", lambda *a, **k: Done())
    result = gateway_wrk.run_wrk(
        "http://127.0.0.1:1", "k", connections=1, duration_s=3, workdir=tmp_path
    )
    assert (result.p50_ms, result.p99_ms, result.rps, result.errors) == (1.55, 3.2, 616.52, 0)
    assert not list(tmp_path.iterdir())  # the script holding the key is gone


def test_streams_through_the_baseline_are_reported_beside_this_code_s(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With --baseline-src the streams go through the baseline's gateway in the same rounds,
    and each gateway's added time is against the stand-in alone (the sockets faked here: the
    timings are fixed per URL)."""
    monkeypatch.syspath_prepend(str(BENCH.parent))
    import gateway_stream

    ttfb = {"http://direct": 0.5, "http://via": 2.0, "http://base": 3.0}  # ms

    def measure(url: str, key: str | None, **_: int) -> object:
        total = ttfb[url] + 64 * (0.01 if url == "http://direct" else 0.05)
        return gateway_stream.StreamTimes([ttfb[url]] * 3, [total] * 3)

    monkeypatch.setattr(gateway_stream, "measure_streams", measure)
    targets = {"direct": ("http://direct", None), "via": ("http://via", "k"),
               "baseline": ("http://base", "k")}  # fmt: skip
    report = gateway_stream.stream_report(targets, rounds=2, requests=3)
    assert report["added_ttfb_ms"]["p50"] == 1.5
    assert report["baseline"]["added_ttfb_ms"]["p50"] == 2.5
    assert report["ratio_added_ttfb_p50"] == 0.6
    assert report["baseline"]["added_per_chunk_ms"]["c1"] == pytest.approx(
        2.5 / 64 + 0.04, abs=1e-4
    )
    assert "baseline" not in gateway_stream.stream_report(
        {k: targets[k] for k in ("direct", "via")}, rounds=1, requests=3
    )


def test_a_chat_target_posts_the_chat_body_to_the_chat_route(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """LiteLLM's proxy and our gateway are compared on OpenAI chat completions."""
    monkeypatch.syspath_prepend(str(BENCH.parent))
    import gateway_wrk

    seen: dict[str, str] = {}

    class Done:
        stdout = WRK_OUTPUT

    def run(argv: list[str], **_: object) -> Done:
        seen["url"], seen["script"] = argv[-1], Path(argv[argv.index("-s") + 1]).read_text()
        return Done()

    monkeypatch.setattr(gateway_wrk.subprocess, "run", run)
    gateway_wrk.run_wrk(
        "http://127.0.0.1:1", "k", connections=1, duration_s=3, workdir=tmp_path, api="chat"
    )
    assert seen["url"] == "http://127.0.0.1:1/v1/chat/completions"
    body = json.loads(seen["script"].split("wrk.body = [[", 1)[1].split("]]", 1)[0])
    assert body["messages"][0]["role"] == "user" and body["max_tokens"] == 8
    assert body["stream"] is False and "token_ids" not in body


@pytest.mark.slow
def test_quick_run_writes_the_json(tiny_model_dir: Path, tmp_path: Path) -> None:
    if shutil.which("wrk") is None:
        pytest.skip("wrk is not installed: apt-get update && apt-get install -y wrk")
    out = tmp_path / "gateway_overhead.json"
    subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--model", str(tiny_model_dir), "--json", str(out),
         "--litellm", "off"],
        check=True, timeout=120,
    )  # fmt: skip
    report = json.loads(out.read_text())
    assert set(report["added_ms"]) == {"p50", "p99"}
    assert report["rps_per_worker"] > 0
    assert all(run["errors"] == 0 for run in report["runs"].values())
    # 64-token streams through the gateway against the stand-in's own (acceptance 3 of issue 48)
    stream = report["stream"]
    assert stream["tokens"] == 64
    assert set(stream["p50_ms"]) == {"direct", "via"}
    assert stream["p50_ms"]["via"]["ttfb_1"] > 0 and "p50" in stream["added_ttfb_ms"]


def test_goal_lines_judge_each_figure_and_name_the_missing_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 48's goals read from the report: a figure on the wrong side fails, one not measured
    (LiteLLM off) is not counted as met."""
    monkeypatch.syspath_prepend(str(BENCH.parent))
    import gateway_report

    report = {"added_ms": {"p50": 1.2}, "rps_per_worker": 1600.0,
              "stream": {"added_ttfb_ms": {"p50": 0.9}}}  # fmt: skip
    lines = gateway_report.goal_lines(report)
    assert lines[0].endswith("1.2ms, NOT met")
    assert lines[1].endswith("1600, met")
    assert lines[2].endswith("not measured in this run")
    assert lines[3].endswith("0.9ms, met")
