"""The report of `bench/gateway_overhead.py`: what the gateway added (the gateway run minus the
direct run) as the JSON that `--json` writes, and the table printed after a run."""

from __future__ import annotations

import argparse
from typing import Any


def summarize(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    direct, via = results["stand-in direct"], results["stand-in via gateway"]
    report: dict[str, Any] = {
        "added_ms": {
            "p50": round(via["p50_ms"] - direct["p50_ms"], 3),
            "p99": round(via["p99_ms"] - direct["p99_ms"], 3),
        },
        "rps_per_worker": round(via["rps"], 1),
        "engine": "stand-in (benchmark fixture: answers the tokens-only protocol instantly)",
        "runs": results,
        "config": {
            "quick": args.quick,
            "duration_s": args.duration,
            "rounds": args.rounds,
            "connections": args.connections,
            "gateway_workers": 1,
            "keys": args.keys,
            "litellm": args.litellm,
            "request": "POST /inference/v1/generate, 32 prompt tokens, 8 new tokens",
        },
    }
    if "stand-in via baseline gateway" in results:
        base = results["stand-in via baseline gateway"]
        base_added = base["p50_ms"] - direct["p50_ms"]
        report["baseline"] = {
            "source": str(args.baseline_src),
            "added_ms": {
                "p50": round(base_added, 3),
                "p99": round(base["p99_ms"] - direct["p99_ms"], 3),
            },
            "rps_per_worker": round(base["rps"], 1),
            # > 1: this code adds more than the baseline / serves fewer requests per second.
            "ratio_added_p50": round(report["added_ms"]["p50"] / base_added, 3),
            "ratio_rps": round(via["rps"] / base["rps"], 3),
        }
    stacks = {
        name.split("[", 1)[1].rstrip("]"): r
        for name, r in results.items()
        if name.startswith("stand-in via gateway [")
    }
    if stacks:  # the gateway on other HTTP stacks (--stacks), the same request and rounds
        report["stacks"] = {
            stack: {
                "added_ms": {"p50": round(r["p50_ms"] - direct["p50_ms"], 3),
                             "p99": round(r["p99_ms"] - direct["p99_ms"], 3)},
                "rps_per_worker": round(r["rps"], 1),
                "ratio_rps": round(r["rps"] / via["rps"], 3),  # over the default stack's
            }
            for stack, r in stacks.items()
        }  # fmt: skip
    if "chat: via LiteLLM" in results:
        chat_direct, chat_via = results["chat: stand-in direct"], results["chat: via gateway"]
        peers = {"litellm": results["chat: via LiteLLM"],
                 "litellm_redis": results["chat: via LiteLLM + Redis"]}  # fmt: skip
        report["chat"] = {
            "added_ms": {"p50": round(chat_via["p50_ms"] - chat_direct["p50_ms"], 3)},
            "rps_per_worker": round(chat_via["rps"], 1),
            **{f"{name}_added_ms": {"p50": round(r["p50_ms"] - chat_direct["p50_ms"], 3)}
               for name, r in peers.items()},
            **{f"{name}_rps": round(r["rps"], 1) for name, r in peers.items()},
        }  # fmt: skip
        # Above 1: loragate serves more chat completions per second than LiteLLM, one worker each.
        report["ratios"] = {
            "vs_litellm": round(chat_via["rps"] / peers["litellm"]["rps"], 2),
            "vs_litellm_redis": round(chat_via["rps"] / peers["litellm_redis"]["rps"], 2),
        }
    if "tiny engine via gateway" in results:
        via = results["tiny engine via gateway"]

        def added(base: dict[str, Any]) -> dict[str, float]:
            return {k: round(via[f"{k}_ms"] - base[f"{k}_ms"], 3) for k in ("p50", "p99")}

        if "tiny engine direct" in results:
            report["tiny_engine_added_ms_vs_unstreamed"] = added(results["tiny engine direct"])
        report["tiny_engine"] = {
            # The gateway always streams from the engine (it detokenizes and watches for stop
            # strings), so the streamed direct call is the like-for-like baseline.
            "added_ms": added(results["tiny engine direct, streamed"]),
            "rps_direct_streamed": round(results["tiny engine direct, streamed"]["rps"], 1),
            "rps_via_gateway": round(via["rps"], 1),
        }
    return report


def print_table(results: dict[str, dict[str, Any]], report: dict[str, Any]) -> None:
    print(f"\n{'run':<42}{'p50 ms':>10}{'p99 ms':>10}{'req/s':>10}{'errors':>8}")
    for name, r in results.items():
        print(
            f"{name:<42}{r['p50_ms']:>10.3f}{r['p99_ms']:>10.3f}{r['rps']:>10.1f}{r['errors']:>8}"
        )
    added = report["added_ms"]
    print(
        f"\ngateway added (stand-in engine, a benchmark fixture): p50 {added['p50']:.3f} ms, "
        f"p99 {added['p99']:.3f} ms; {report['rps_per_worker']:.0f} req/s per gateway worker"
    )
    if "baseline" in report:
        b = report["baseline"]
        print(
            f"baseline gateway ({b['source']}): p50 {b['added_ms']['p50']:.3f} ms added, "
            f"{b['rps_per_worker']:.0f} req/s; this code / baseline: added p50 x"
            f"{b['ratio_added_p50']:.3f}, req/s x{b['ratio_rps']:.3f}"
        )
    if "stream" in report:
        st = report["stream"]
        print(
            f"{st['tokens']}-token streams: time to first byte added p50 "
            f"{st['added_ttfb_ms']['p50']:.3f} ms; added per chunk "
            f"{st['added_per_chunk_ms']['c1']:.4f} ms (one connection), "
            f"{st['added_per_chunk_ms']['c16']:.4f} ms (16 connections)"
        )
        if "baseline" in st:
            sb = st["baseline"]
            print(
                f"  baseline's streams: first byte added p50 {sb['added_ttfb_ms']['p50']:.3f} ms"
                f" (this code / baseline x{st.get('ratio_added_ttfb_p50', float('nan')):.3f}); "
                f"per chunk {sb['added_per_chunk_ms']['c1']:.4f} / "
                f"{sb['added_per_chunk_ms']['c16']:.4f} ms"
            )
    for stack, r in report.get("stacks", {}).items():
        print(
            f"gateway on {stack}: p50 {r['added_ms']['p50']:.3f} ms added, "
            f"{r['rps_per_worker']:.0f} req/s (x{r['ratio_rps']:.3f} the default stack's)"
        )
    if "chat" in report:
        c, r = report["chat"], report["ratios"]
        print(
            f"chat completions, one worker each: loragate {c['rps_per_worker']:.0f} req/s "
            f"(p50 {c['added_ms']['p50']:.3f} ms added), LiteLLM {c['litellm_rps']:.0f} "
            f"({c['litellm_added_ms']['p50']:.3f} ms), LiteLLM + Redis {c['litellm_redis_rps']:.0f} "
            f"({c['litellm_redis_added_ms']['p50']:.3f} ms): vs LiteLLM {r['vs_litellm']:.2f}x, "
            f"vs LiteLLM + Redis {r['vs_litellm_redis']:.2f}x"
        )
    if "tiny_engine" in report:
        t = report["tiny_engine"]
        print(
            f"gateway added (real engine, tiny model, vs the engine streamed): "
            f"p50 {t['added_ms']['p50']:.3f} ms, p99 {t['added_ms']['p99']:.3f} ms"
        )
    for line in goal_lines(report):
        print(line)


# Issue 48's goals for the full configuration (PostgreSQL keys, Redis quotas, metrics on).
GOALS = (
    ("added p50 at one connection", ("added_ms", "p50"), "<=", 1.0, "ms"),
    ("req/s per worker at 16 connections", ("rps_per_worker",), ">=", 1500.0, ""),
    ("chat vs LiteLLM's proxy at 16 connections", ("ratios", "vs_litellm"), ">=", 10.0, "x"),
    ("a stream's first byte added, p50", ("stream", "added_ttfb_ms", "p50"), "<=", 1.0, "ms"),
)


def goal_lines(report: dict[str, Any]) -> list[str]:
    """One line per goal: the figure, the goal and whether it is met (a figure this run did not
    measure, e.g. LiteLLM with `--litellm off`, says so instead of passing)."""
    lines = []
    for name, path, op, goal, unit in GOALS:
        value: Any = report
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        if value is None:
            lines.append(f"goal: {name} {op} {goal:g}{unit}: not measured in this run")
            continue
        met = value <= goal if op == "<=" else value >= goal
        verdict = "met" if met else "NOT met"
        lines.append(f"goal: {name} {op} {goal:g}{unit}: {value:g}{unit}, {verdict}")
    return lines
