"""llguidance against xgrammar on the served model's tokenizer: the measurement behind the engine's
choice of grammar backend (docs/architecture.md#structured-outputs).

    python bench/grammar_backends.py --model .cache/models/small --json bench/out/grammar_backends.json
      [--huge] [--rows 64] [--steps 80]

For each backend, on one thread (the engine's compile worker runs one compile on one thread):
- compile: the time from a JSON Schema to a matcher ready for its first mask, for the bounded
  schemas of tests/structured_cases.py (median and max) and for hostile ones (deep nesting, a
  100,000-value enum, with --huge a 1.4 MB object of 25,000 properties, which took xgrammar
  minutes); a backend's refusal is reported as such;
- mask: `rows` random walks (one per schema, cycled) advanced together for `steps` steps, each
  step filling every live row's bitmask as the engine does; microseconds a row and
  milliseconds a step, cold (the first steps) and warm.

xgrammar is not one of loragate's dependencies: install it into the venv to measure it
(`.venv/bin/pip install -c .venv/constraints.txt xgrammar`); without it its column says so.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from tests.structured_cases import SCHEMAS


def hostile_schemas(huge: bool) -> dict[str, Any]:
    deep: Any = {"type": "integer"}
    for _ in range(60):
        deep = {"type": "object", "properties": {"a": deep}, "required": ["a"]}
    out: dict[str, Any] = {
        "deep_60": deep,
        "enum_100k": {"enum": [f"v{i}" for i in range(100_000)]},
    }
    if huge:
        n = 25_000
        out["props_25k"] = {
            "type": "object",
            "properties": {f"field_{i}": {"type": "string", "maxLength": 8} for i in range(n)},
            "required": [f"field_{i}" for i in range(0, n, 3)],
        }
    return out


class Backend:
    """compile(schema) -> matcher; fill(matchers with rows, bitmask); accept(matcher, token)."""

    name: str

    def compile(self, schema: Any) -> Any: ...
    def fill(self, pairs: list[tuple[int, Any]], bitmask: torch.Tensor) -> None: ...
    def accept(self, matcher: Any, token: int) -> None: ...
    def done(self, matcher: Any) -> bool: ...


class Llguidance(Backend):
    name = "llguidance"

    def __init__(self, hf: Any, vocab: int) -> None:
        import llguidance
        import llguidance.hf
        import llguidance.torch

        self._llg, self._torch = llguidance, llguidance.torch
        self._tokenizer = llguidance.hf.from_tokenizer(hf, n_vocab=vocab)

    def compile(self, schema: Any) -> Any:
        grammar = self._llg.LLMatcher.grammar_from_json_schema(
            json.dumps(schema), defaults={"whitespace_flexible": False}
        )
        matcher = self._llg.LLMatcher(self._tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise ValueError(matcher.get_error()[:120])
        return matcher

    def fill(self, pairs: list[tuple[int, Any]], bitmask: torch.Tensor) -> None:
        for row, matcher in pairs:
            self._torch.fill_next_token_bitmask(matcher, bitmask, row)

    def accept(self, matcher: Any, token: int) -> None:
        assert matcher.consume_token(token)

    def done(self, matcher: Any) -> bool:
        return bool(matcher.is_stopped())


class Xgrammar(Backend):
    name = "xgrammar"

    def __init__(self, hf: Any, vocab: int) -> None:
        import xgrammar

        self._xgr = xgrammar
        info = xgrammar.TokenizerInfo.from_huggingface(hf, vocab_size=vocab)
        self._compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)

    def compile(self, schema: Any) -> Any:
        compiled = self._compiler.compile_json_schema(json.dumps(schema), any_whitespace=False)
        return self._xgr.GrammarMatcher(compiled)

    def fill(self, pairs: list[tuple[int, Any]], bitmask: torch.Tensor) -> None:
        for row, matcher in pairs:
            matcher.fill_next_token_bitmask(bitmask, row)

    def accept(self, matcher: Any, token: int) -> None:
        assert matcher.accept_token(token)

    def done(self, matcher: Any) -> bool:
        return bool(matcher.is_terminated())


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    try:
        result = fn()
    except Exception as exc:  # a backend's refusal is a result here, not a failure
        result = exc
    return time.perf_counter() - start, result


def compile_figures(backend: Backend, huge: bool) -> dict[str, Any]:
    bounded = [timed(lambda s=schema: backend.compile(s))[0] for schema in SCHEMAS.values()]
    hostile = {}
    for name, schema in hostile_schemas(huge).items():
        seconds, result = timed(lambda s=schema: backend.compile(s))
        refused = str(result)[:120] if isinstance(result, Exception) else None
        hostile[name] = {"ms": round(seconds * 1e3, 1), "refused": refused}
    return {
        "bounded_ms_median": round(statistics.median(bounded) * 1e3, 2),
        "bounded_ms_max": round(max(bounded) * 1e3, 2),
        "hostile": hostile,
    }


def allowed_ids(bits: torch.Tensor, vocab: int) -> list[int]:
    shifts = torch.tensor([1 << i for i in range(31)] + [-(1 << 31)], dtype=torch.int32)
    allowed = ((bits.unsqueeze(-1) & shifts) != 0).flatten()[:vocab]
    return torch.nonzero(allowed).flatten().tolist()


def mask_figures(backend: Backend, vocab: int, rows: int, steps: int) -> dict[str, Any]:
    rng = random.Random(0)
    schemas = list(SCHEMAS.values())
    matchers = [backend.compile(schemas[i % len(schemas)]) for i in range(rows)]
    bitmask = torch.zeros(rows, (vocab + 31) // 32, dtype=torch.int32)
    per_step: list[tuple[float, int]] = []
    for _ in range(steps):
        live = [(i, m) for i, m in enumerate(matchers) if not backend.done(m)]
        if not live:
            break
        seconds, _ = timed(lambda live=live: backend.fill(live, bitmask))
        per_step.append((seconds, len(live)))
        for i, matcher in live:
            backend.accept(matcher, rng.choice(allowed_ids(bitmask[i], vocab)))
    cold, warm = per_step[:5], per_step[5:] or per_step

    def us_per_row(part: list[tuple[float, int]]) -> float:
        return round(sum(s for s, _ in part) / sum(n for _, n in part) * 1e6, 1)

    return {
        "steps": len(per_step),
        "cold_us_per_row": us_per_row(cold),
        "warm_us_per_row": us_per_row(warm),
        "warm_ms_per_step_at_full_batch": round(us_per_row(warm) * rows / 1e3, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=".cache/models/small")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--huge", action="store_true", help="add the 1.4 MB schema (slow)")
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--steps", type=int, default=80)
    args = parser.parse_args()

    from transformers import AutoTokenizer

    torch.set_num_threads(1)
    hf = AutoTokenizer.from_pretrained(args.model)
    vocab = json.loads((Path(args.model) / "config.json").read_text())["vocab_size"]
    results: dict[str, Any] = {"model": args.model, "vocab_size": vocab, "backends": {}}
    for make in (Llguidance, Xgrammar):
        try:
            backend = make(hf, vocab)
        except ImportError:
            results["backends"][make.name] = {"missing": "pip install " + make.name}
            continue
        results["backends"][make.name] = {
            "compile": compile_figures(backend, args.huge),
            "mask": mask_figures(backend, vocab, args.rows, args.steps),
        }
    for name, figures in results["backends"].items():
        print(f"{name}: {json.dumps(figures)}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
