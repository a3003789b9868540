"""bench/gateway_profile.py's report: py-spy's raw (collapsed stack) output read into self time by
frame and by area, and the printout."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

# Our packages are split by subpackage (gateway/engines, tenancy/quota, ...): a single "gateway"
# row would say nothing about where to look.
OURS = ("gateway", "tenancy", "engine", "lora", "kernels")
_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")
_STDLIB = re.compile(r".*/python3\.\d+/")


def short_path(path: str, root: Path) -> str:
    """A frame's file relative to what imported it: the checkout, site-packages or the
    standard library (py-spy writes absolute or already-shortened paths depending on sys.path)."""
    prefix = str(root).rstrip("/") + "/"
    if path.startswith(prefix):
        return path[len(prefix) :]
    if "site-packages/" in path:
        return path.split("site-packages/", 1)[1]
    return _STDLIB.sub("", path)


def area(path: str) -> str:
    parts = path.split("/")
    if parts[0] in OURS and len(parts) > 2:
        return "/".join(parts[:2])
    if parts[0] in OURS:
        return parts[0]
    if len(parts) == 1:  # a module of the standard library (typing.py) or a script
        return "stdlib" if path.endswith(".py") else "other"
    return parts[0]


def aggregate_raw(text: str, *, root: Path, top: int = 15) -> dict[str, Any]:
    """Self samples (the innermost frame of each stack) by frame and by area, in percent of all
    samples. A line of py-spy's raw output is `frame;frame;...;frame COUNT`."""
    frames: Counter[str] = Counter()
    areas: Counter[str] = Counter()
    total = 0
    for line in text.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        leaf = stack.rsplit(";", 1)[-1]
        match = _FRAME.match(leaf)
        if match is None:
            name, where = leaf, "other"
        else:
            path = short_path(match["file"], root)
            name, where = f"{match['func']} ({path})", area(path)
        frames[name] += count
        areas[where] += count
        total += count
    if total == 0:
        raise ValueError("the profile holds no samples")

    def percent(counter: Counter[str], n: int | None) -> list[list[Any]]:
        return [[name, round(100 * c / total, 1)] for name, c in counter.most_common(n)]

    return {"samples": total, "top_frames": percent(frames, top), "areas": percent(areas, None)}


def print_report(report: dict[str, Any]) -> None:
    per_request = report["cpu_us_per_request"]
    total = sum(per_request.values())
    print(f"\n{report['rps']:.0f} req/s; CPU a request, by process:")
    for name, us in sorted(per_request.items(), key=lambda item: -item[1]):
        print(f"  {name:<10}{us:>8.1f} us  {100 * us / total:5.1f}%")
    print(f"the gateway's share of a request's CPU: {100 * report['gateway_share']:.1f}%")
    if "note" in report:
        print(report["note"])
    if "profile" not in report:
        return
    prof = report["profile"]
    print(f"\ngateway worker, py-spy self time ({prof['samples']} samples), by area:")
    for name, pct in prof["areas"]:
        if pct >= 0.5:
            print(f"  {pct:5.1f}%  {name}")
    print("top frames:")
    for name, pct in prof["top_frames"]:
        print(f"  {pct:5.1f}%  {name}")
