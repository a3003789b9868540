"""The start-up choices of native paths do not depend on the machine's load (issue 47): timed
once, saved in the tuning file under a key of the CPU, model shape, dtype, threads and torch,
and read by every later start (engine/step/choices/tuning.py, engine/step/choices/startup.py).

The acceptance test starts the engine five times on the machine as it is and five times beside a
process spinning on every core, all with one fresh tuning file: the ten choose the same paths,
and only the first timed them. One `loragate engine` process then shows them in its start-up log
and on /metrics.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from pathlib import Path

import pytest
import torch
from cpu_hog import cpu_hog

from engine.config import EngineConfig
from engine.loop.llm_engine import LLMEngine
from engine.models.hf_config import ModelConfig, load_model_config
from engine.step.choices.choice import DECODE_ATTENTION, StartupChoice
from engine.step.choices.cpu_load import others_busy_cores
from engine.step.choices.startup import StartupChoices
from engine.step.choices.timing import best_times
from engine.step.choices.tuning import TimedChoice, read_choices, save_choices, tuning_key
from engine.step.threads import available_cores
from tests.gateway.engine_processes import start_engines

CPUINFO = "processor\t: 0\nmodel name\t: Test CPU 9000\nflags\t\t: fpu sse2 avx2 fma avx\n"


@pytest.fixture(scope="module")
def model(tiny_model_dir: Path) -> ModelConfig:
    return load_model_config(str(tiny_model_dir))


def _cpuinfo(tmp_path: Path, text: str = CPUINFO) -> Path:
    path = tmp_path / f"cpuinfo-{abs(hash(text))}"
    path.write_text(text)
    return path


def test_the_key_names_what_a_timing_depends_on(model: ModelConfig, tmp_path: Path) -> None:
    cpuinfo = _cpuinfo(tmp_path)
    key = tuning_key(model, torch.bfloat16, 2, cpuinfo)
    assert key == tuning_key(model, torch.bfloat16, 2, cpuinfo)
    assert key.digest() == tuning_key(model, torch.bfloat16, 2, cpuinfo).digest()
    assert key.cpu_model == "Test CPU 9000" and key.cpu_flags == ("avx", "avx2", "fma")
    # flags the kernels do not choose by, and their order, leave the key alone
    shuffled = _cpuinfo(tmp_path, CPUINFO.replace("fpu sse2 avx2 fma avx", "fma avx avx2 vme"))
    assert tuning_key(model, torch.bfloat16, 2, shuffled).digest() == key.digest()
    amx = _cpuinfo(tmp_path, CPUINFO.replace("avx\n", "avx amx_bf16\n"))
    others = [
        tuning_key(model, torch.bfloat16, 4, cpuinfo),  # threads
        tuning_key(model, torch.float32, 2, cpuinfo),  # dtype
        tuning_key(dataclasses.replace(model, hidden_size=512), torch.bfloat16, 2, cpuinfo),
        tuning_key(dataclasses.replace(model, num_kv_heads=2), torch.bfloat16, 2, cpuinfo),
        tuning_key(model, torch.bfloat16, 2, amx),  # an instruction set more
        tuning_key(model, torch.bfloat16, 2, _cpuinfo(tmp_path, CPUINFO.replace("9000", "9001"))),
        dataclasses.replace(key, torch_version="0.0.1"),
    ]
    digests = {k.digest() for k in others}
    assert len(digests) == len(others) and key.digest() not in digests


def test_choices_survive_a_save_and_a_read(model: ModelConfig, tmp_path: Path) -> None:
    path = tmp_path / "cache" / "tuning.json"  # the directory is made
    key = tuning_key(model, torch.bfloat16, 2, _cpuinfo(tmp_path))
    other = dataclasses.replace(key, num_threads=8)
    assert read_choices(path, key) == {}  # no file yet: nothing, no warning needed
    native = TimedChoice.now("native", "native 0.20 ms, sdpa 0.90 ms")
    assert save_choices(path, key, {DECODE_ATTENTION: native})
    assert save_choices(path, other, {DECODE_ATTENTION: TimedChoice.now("sdpa", "x")})
    every = TimedChoice.now("every", "oneDNN / kernel time at 1 rows 1.40")
    assert save_choices(path, key, {"native_matmul": every})  # merged into the entry
    assert read_choices(path, key) == {DECODE_ATTENTION: native, "native_matmul": every}
    assert read_choices(path, other)[DECODE_ATTENTION].value == "sdpa"
    assert not list(path.parent.glob("*.partial"))  # written whole, renamed into place
    data = json.loads(path.read_text())
    assert data["entries"][key.digest()]["key"]["num_threads"] == 2  # readable beside its digest


@pytest.mark.parametrize(
    "text",
    [
        "{not json",
        "[1, 2]",
        '{"version": 99, "entries": {}}',
        '{"version": 1, "entries": []}',
    ],
)
def test_an_unreadable_or_foreign_file_is_ignored_with_a_warning(
    model: ModelConfig, tmp_path: Path, caplog: pytest.LogCaptureFixture, text: str
) -> None:
    path = tmp_path / "tuning.json"
    path.write_text(text)
    key = tuning_key(model, torch.bfloat16, 2, _cpuinfo(tmp_path))
    with caplog.at_level(logging.WARNING, logger="engine.step.choices.tuning"):
        assert read_choices(path, key) == {}
    assert "tuning file" in caplog.text and "ignored" in caplog.text
    # the next save replaces it with a good one
    assert save_choices(path, key, {DECODE_ATTENTION: TimedChoice.now("sdpa", "x")})
    assert read_choices(path, key)[DECODE_ATTENTION].value == "sdpa"


def test_a_malformed_entry_or_choice_is_timed_again(
    model: ModelConfig, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "tuning.json"
    key = tuning_key(model, torch.bfloat16, 2, _cpuinfo(tmp_path))
    good = {"value": "sdpa", "figures": "x", "timed_at": "t"}
    bad = {"native_matmul": {"v": 1}, "packed_float32": {**good, "under_load": "no"}}
    entry = {"key": key.as_json(), "choices": {DECODE_ATTENTION: good, **bad}}
    path.write_text(json.dumps({"version": 1, "entries": {key.digest(): entry}}))
    with caplog.at_level(logging.WARNING, logger="engine.step.choices.tuning"):
        assert list(read_choices(path, key)) == [DECODE_ATTENTION]
    assert "'native_matmul' is malformed" in caplog.text
    assert "'packed_float32' is malformed" in caplog.text
    # an entry under this key's digest that names another key (edited by hand) is not used
    entry["key"] = {**key.as_json(), "num_threads": 64}
    path.write_text(json.dumps({"version": 1, "entries": {key.digest(): entry}}))
    assert read_choices(path, key) == {}


def test_an_unwritable_file_warns_and_the_start_goes_on(
    model: ModelConfig, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "file").write_text("")
    path = tmp_path / "file" / "tuning.json"  # under a file: no directory can be made
    key = tuning_key(model, torch.bfloat16, 2, _cpuinfo(tmp_path))
    with caplog.at_level(logging.WARNING, logger="engine.step.choices.tuning"):
        assert not save_choices(path, key, {DECODE_ATTENTION: TimedChoice.now("sdpa", "x")})
    assert "not written" in caplog.text
    choices = StartupChoices(key, path, probe=lambda: 0.0)
    assert choices.decide(DECODE_ATTENTION, ("sdpa",), lambda: ("sdpa", "x")).path is None


def test_a_saved_choice_is_read_and_timed_only_once(model: ModelConfig, tmp_path: Path) -> None:
    path, key = tmp_path / "tuning.json", tuning_key(model, torch.float32, 2, _cpuinfo(tmp_path))
    timings: list[str] = []

    def timed(value: str) -> tuple[str, str]:
        timings.append(value)
        return value, f"{value} fastest"

    def decide(choices: StartupChoices, value: str, allowed: tuple[str, ...]) -> StartupChoice:
        return choices.decide(DECODE_ATTENTION, allowed, lambda: timed(value))

    first = decide(StartupChoices(key, path, probe=lambda: 0.0), "native", ("native", "sdpa"))
    assert (first.value, first.source, first.path) == ("native", "timed", str(path))
    assert "native fastest" in first.origin() and f"saved to {path}" in first.origin()
    # a later start reads it: the timing would now say sdpa, and is not asked
    again = decide(StartupChoices(key, path, probe=lambda: 0.0), "sdpa", ("native", "sdpa"))
    assert (again.value, again.source) == ("native", "saved") and timings == ["native"]
    assert f"from {path}, timed {first.timed_at}: native fastest" in again.origin()
    # a saved path that cannot run here now is timed again
    fallback = decide(StartupChoices(key, path, probe=lambda: 0.0), "sdpa", ("matmul", "sdpa"))
    assert (fallback.value, fallback.source) == ("sdpa", "timed")
    # --tune: timed again whatever the file holds, and the new choice replaces the old
    retune = StartupChoices(key, path, retune=True, probe=lambda: 0.0)
    tuned = decide(retune, "matmul", ("native", "matmul"))
    assert tuned.source == "timed" and read_choices(path, key)[DECODE_ATTENTION].value == "matmul"
    # no tuning file: timed at every start, nothing saved
    unsaved = StartupChoices()
    assert decide(unsaved, "sdpa", ("sdpa",)).origin().endswith("not saved (no tuning file)")
    assert timings == ["native", "sdpa", "matmul", "sdpa"]


def test_a_timing_on_a_busy_machine_says_so(
    model: ModelConfig, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path, key = tmp_path / "tuning.json", tuning_key(model, torch.float32, 2, _cpuinfo(tmp_path))
    busy = float(available_cores())
    choices = StartupChoices(key, path, probe=lambda: busy)
    with caplog.at_level(logging.WARNING, logger="engine.step.choices.startup"):
        choice = choices.decide(DECODE_ATTENTION, ("sdpa",), lambda: ("sdpa", "sdpa 1 ms"))
    assert "loragate engine --tune" in caplog.text and str(path) in caplog.text
    assert f"other processes kept {busy:.1f} of" in choice.detail  # the figures keep it, saved
    saved = read_choices(path, key)[DECODE_ATTENTION]
    assert "other processes kept" in saved.figures and saved.under_load
    # every later start that reads it says so again, and keeps it
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="engine.step.choices.startup"):
        later = StartupChoices(key, path, probe=lambda: 0.0)
    assert "were timed while other processes kept" in caplog.text
    assert later.decide(DECODE_ATTENTION, ("sdpa",), lambda: ("sdpa", "x")).source == "saved"
    # a quiet timing: no warning, not marked
    caplog.clear()
    quiet = StartupChoices(key, path, retune=True, probe=lambda: 0.0)
    with caplog.at_level(logging.WARNING, logger="engine.step.choices.startup"):
        quiet.decide(DECODE_ATTENTION, ("sdpa",), lambda: ("sdpa", "x"))
    assert not caplog.text and not read_choices(path, key)[DECODE_ATTENTION].under_load


def test_best_times_interleaves_the_candidates() -> None:
    calls: list[str] = []
    runs = {name: (lambda name=name: calls.append(name)) for name in ("a", "b", "c")}
    timings = best_times(runs, 3)
    assert set(timings) == {"a", "b", "c"} and all(t >= 0 for t in timings.values())
    # one untimed call each, then rounds of every candidate, each round starting one later
    assert calls == ["a", "b", "c", "a", "b", "c", "b", "c", "a", "c", "a", "b"]


def test_metrics_show_each_choice(tmp_path: Path) -> None:
    from engine.metrics import EngineMetrics
    from engine.outputs import EngineStats

    stats = EngineStats(0, 0, 0.0, 0, 0, 0, 0, 0)
    made = [
        StartupChoice(DECODE_ATTENTION, "native", "saved", "x", str(tmp_path), "t"),
        StartupChoice("native_matmul", "every", "pinned", "pinned by native_matmul on"),
    ]
    registry = EngineMetrics(model_name="m", stats=lambda: stats, choices=made).registry
    name = "loragate_engine_startup_choice"
    labels = {"model_name": "m", "choice": DECODE_ATTENTION, "value": "native", "source": "saved"}
    assert registry.get_sample_value(name, labels) == 1.0
    labels = {"model_name": "m", "choice": "native_matmul", "value": "every", "source": "pinned"}
    assert registry.get_sample_value(name, labels) == 1.0
    assert registry.get_sample_value(name, {**labels, "value": "none"}) is None


# ---- the acceptance test: ten starts, five beside a CPU hog ---------------------------------


def _start(model_dir: Path, tuning_file: Path, threads: int) -> dict[str, StartupChoice]:
    engine = LLMEngine(
        EngineConfig(
            model=str(model_dir),  # float32: the four choices (packing too) are timed here
            num_kv_blocks=64,
            max_num_seqs=4,
            enable_lora=False,
            threads=threads,
            tuning="saved",
            tuning_file=str(tuning_file),
        )
    )
    return {choice.name: choice for choice in engine.startup_choices}


def _starts_quiet_then_beside_a_hog(
    model_dir: Path, tuning_file: Path, num_quiet: int, num_beside_hog: int
) -> list[dict[str, StartupChoice]]:
    """Engine starts on one fresh tuning file: the machine as it is, then beside the hog. The
    same paths at every start, timed at the first alone: the file unchanged after it."""
    threads = max(1, os.cpu_count() or 1)  # as start_engines gives its one engine
    starts = [_start(model_dir, tuning_file, threads) for _ in range(num_quiet)]
    saved = tuning_file.read_text()
    with cpu_hog():
        busy = others_busy_cores()
        starts += [_start(model_dir, tuning_file, threads) for _ in range(num_beside_hog)]
    assert busy is None or busy > 0.5 * available_cores()  # the hog did load the cores
    chosen = [{name: choice.value for name, choice in start.items()} for start in starts]
    assert all(c == chosen[0] for c in chosen), chosen
    timed = {name for name, choice in starts[0].items() if choice.source == "timed"}
    assert DECODE_ATTENTION in timed or starts[0][DECODE_ATTENTION].source == "fixed"
    for start in starts[1:]:  # only the first start timed; the rest read the file
        assert {name for name, choice in start.items() if choice.source == "saved"} == timed
        assert not any(choice.source == "timed" for choice in start.values())
    assert tuning_file.read_text() == saved  # nothing timed, nothing rewritten
    return starts


def test_a_start_beside_a_cpu_hog_keeps_the_paths_a_quiet_start_timed(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Acceptance 2 in brief (two starts, ~20 s on 2 cores); the slow test below is the whole."""
    _starts_quiet_then_beside_a_hog(tiny_model_dir, tmp_path / "tuning.json", 1, 1)


@pytest.mark.slow  # ten engine starts and a server process: ~2 minutes on a busy 2-core box
def test_ten_starts_quiet_and_beside_a_cpu_hog_choose_the_same_paths(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    tuning_file = tmp_path / "tuning" / "tuning.json"
    starts = _starts_quiet_then_beside_a_hog(tiny_model_dir, tuning_file, 5, 5)
    first = starts[0]
    timed = {name for name, choice in first.items() if choice.source == "timed"}

    # a `loragate engine` process: the same paths, read from the file, in its log and /metrics
    (engine,) = start_engines(tiny_model_dir, tmp_path, 1, "--tuning-file", str(tuning_file))
    try:
        for name, choice in first.items():
            assert engine.metric(
                "loragate_engine_startup_choice",
                choice=name,
                value=choice.value,
                source="saved" if name in timed else choice.source,
            ) == 1.0, name  # fmt: skip
    finally:
        engine.kill()
    log = engine.log_path.read_text()
    decode = first[DECODE_ATTENTION].value
    assert f"decode attention: {decode} (from {tuning_file}, timed" in log
    assert log.count(f"(from {tuning_file}, timed") == len(timed)
    assert "timed at this start" not in log
