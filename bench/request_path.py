"""Which gateway files one chat request passes through, in order, and how often it returns to a
file it already left (a reader following the request has to go back there).

Runs a real gateway app in this process (tiny model, SQLite, in-process engine and quotas),
sends one chat completion (whole, then streamed) and records, with `sys.setprofile`, every call
into a module under `gateway/` made by the request's own code (start-up is not traced). The
engine thread is not traced: only the gateway's side of the request counts.

    python bench/request_path.py [--model DIR] [--json PATH]

Prints, per mode, the distinct files, the distinct file-to-file steps (edges), the number of
file changes and the number of returns to a file already visited (per-token loops count each
time, so compare these between versions, not with a target). No timing: this is a structural measurement, the same on any machine.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import secrets
import sys
import tempfile
import threading
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
GATEWAY = ROOT / "gateway"


def _path_of(frame: FrameType) -> str | None:
    filename = frame.f_code.co_filename
    if not filename.startswith(str(GATEWAY)):
        return None
    return str(Path(filename).relative_to(ROOT))


class Tracer:
    """The sequence of gateway files entered by calls on this thread (consecutive repeats folded)."""

    def __init__(self) -> None:
        self.sequence: list[str] = []
        self._thread = threading.get_ident()

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call" or threading.get_ident() != self._thread:
            return
        path = _path_of(frame)
        if path is not None and (not self.sequence or self.sequence[-1] != path):
            self.sequence.append(path)

    def summary(self) -> dict[str, Any]:
        seen: set[str] = set()
        returns = 0
        previous = None
        for path in self.sequence:
            if path in seen and path != previous:
                returns += 1
            seen.add(path)
            previous = path
        edges = set(zip(self.sequence, self.sequence[1:], strict=False))
        return {
            "files": sorted(seen),
            "num_files": len(seen),
            "num_edges": len(edges),
            "num_changes": max(0, len(self.sequence) - 1),
            "num_returns": returns,
            "sequence": self.sequence,
        }


async def _tenant_key(state: Any) -> str:
    from tenancy.auth.principal import AuditContext, Principal
    from tenancy.auth.scopes import Scope
    from tenancy.crud.keys import create_key
    from tenancy.crud.tenants import create_tenant
    from tenancy.schemas import ApiKeyCreate, TenantCreate

    runtime = state.tenancy
    ctx = AuditContext(
        principal=Principal(subject="bench", tenant_id=None, scopes=frozenset({Scope.ADMIN}))
    )
    async with runtime.sessionmaker() as session:
        tenant = await create_tenant(
            session,
            ctx=ctx,
            data=TenantCreate(name="path", tier="standard"),
            tiers=runtime.tier_names,
            default_tier=runtime.settings.default_tier,
        )
        created = await create_key(
            session,
            ctx=ctx,
            minter=runtime.minter,
            tenant_id=tenant.id,
            data=ApiKeyCreate(name="k", scopes=[Scope.INFERENCE]),
            now=dt.datetime.now(dt.UTC),
        )
    return str(created.key)


async def measure(model: Path, workdir: Path) -> dict[str, Any]:
    import httpx

    from gateway.app import create_app
    from gateway.settings import GatewaySettings

    settings = GatewaySettings(
        model=model,
        served_model_name="tiny",
        database_url=f"sqlite+aiosqlite:///{workdir / 'gateway.db'}",
        key_pepper=secrets.token_urlsafe(32),
        salt_secret=secrets.token_urlsafe(32),
        adapter_store_dir=workdir / "adapters",
        auto_migrate=True,
        engine={"num_kv_blocks": 256},
    )
    app = create_app(settings)
    results: dict[str, Any] = {}
    async with app.router.lifespan_context(app):
        key = await _tenant_key(app.state.gateway)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            headers = {"authorization": f"Bearer {key}"}
            for mode in ("whole", "streamed"):
                body = {
                    "model": "tiny",
                    "messages": [{"role": "user", "content": "Trace me."}],
                    "max_tokens": 4,
                    "temperature": 0,
                    "stream": mode == "streamed",
                }
                # Once untraced, so lazy imports and first-use caches are not counted.
                await client.post("/v1/chat/completions", json=body, headers=headers)
                tracer = Tracer()
                sys.setprofile(tracer)
                try:
                    r = await client.post("/v1/chat/completions", json=body, headers=headers)
                    await asyncio.sleep(0.2)  # settlement and the usage record finish
                finally:
                    sys.setprofile(None)
                if r.status_code != 200:
                    raise SystemExit(f"chat request failed: {r.status_code} {r.text}")
                results[mode] = tracer.summary()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=ROOT / ".cache/models/tiny")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--sequence", action="store_true", help="print the file sequence")
    args = parser.parse_args()
    if not (args.model / "config.json").is_file():
        from engine.make_model import make_model

        make_model(args.model, size="tiny")
    with tempfile.TemporaryDirectory(prefix="lg-path-") as tmp:
        results = asyncio.run(measure(args.model, Path(tmp)))
    for mode, summary in results.items():
        print(
            f"{mode:9s} files={summary['num_files']:3d} edges={summary['num_edges']:3d} "
            f"changes={summary['num_changes']:4d} returns={summary['num_returns']:4d}"
        )
        print("          " + ", ".join(p.removeprefix("gateway/") for p in summary["files"]))
        if args.sequence:
            print(
                "          " + " > ".join(p.removeprefix("gateway/") for p in summary["sequence"])
            )
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
