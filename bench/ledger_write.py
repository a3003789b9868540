"""Usage ledger write benchmark: the gateway's CPU per ledger row on PostgreSQL, COPY (what the
ledger uses there, tenancy/crud/usage_copy.py) against SQLAlchemy's executemany INSERT (what it
used before, and still uses on SQLite), interleaved in one run.

A gateway writes one ledger row per request, in batches every `LORAGATE_USAGE_FLUSH_INTERVAL_S`
(0.5 s): at 1,000 requests a second a batch holds about 500 rows, and the event loop is busy
for the batch's whole write (a request arriving meanwhile waits). Measured: this process's CPU
time (not wall time, so other load on the machine counts little) per batch and per row, for
batches of 16 and 500 rows, medians over rounds that alternate the two paths.

    python bench/ledger_write.py [--quick] [--json PATH] [--database-url URL]

Without --database-url (or DATABASE_URL), a fresh database on the local PostgreSQL
(postgresql+asyncpg://postgres@127.0.0.1:5432). No goal: issue 48's gateway CPU per request.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sqlalchemy import Table, insert, text  # noqa: E402
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker  # noqa: E402

from tenancy.crud.usage import UsageIn, record_usage_batch  # noqa: E402
from tenancy.crud.usage_copy import can_copy  # noqa: E402
from tenancy.ids import ApiKeyId, RequestId, TenantId, new_id  # noqa: E402
from tenancy.sql.migrate import upgrade  # noqa: E402
from tenancy.sql.models import UsageRecord  # noqa: E402
from tenancy.sql.session import make_engine, make_sessionmaker  # noqa: E402

Writer = Callable[[async_sessionmaker[AsyncSession], list[UsageIn]], Awaitable[None]]


def records(n: int) -> list[UsageIn]:
    now = dt.datetime.now(dt.UTC)
    return [
        UsageIn(
            request_id=RequestId(uuid.uuid4().hex),
            tenant_id=TenantId(str(uuid.uuid4())),
            api_key_id=ApiKeyId(str(uuid.uuid4())),
            model="tiny",
            adapter_id=None,
            prompt_tokens=32,
            completion_tokens=8,
            cached_tokens=0,
            finish_reason="length",
            started_at=now,
            finished_at=now,
            cost_micros=42,
        )
        for _ in range(n)
    ]


async def write_copy(sessions: async_sessionmaker[AsyncSession], batch: list[UsageIn]) -> None:
    async with sessions() as session:
        assert can_copy(session)
        await record_usage_batch(session, records=batch)


async def write_insert(sessions: async_sessionmaker[AsyncSession], batch: list[UsageIn]) -> None:
    """The ledger's write before COPY: the same rows through one Core executemany INSERT."""
    rows = [
        {"id": new_id(), "day": r.finished_at.astimezone(dt.UTC).date(), **vars(r)} for r in batch
    ]
    async with sessions() as session:
        await session.execute(insert(cast(Table, UsageRecord.__table__)), rows)
        await session.commit()


async def cpu_per_batch(
    write: Writer, sessions: async_sessionmaker[AsyncSession], size: int, batches: int
) -> float:
    work = [records(size) for _ in range(batches)]  # built before the clock starts
    started = time.process_time()
    for batch in work:
        await write(sessions, batch)
    return (time.process_time() - started) / batches


async def fresh_database(server: str) -> str:
    import asyncpg

    name = f"lgbench_ledger_{uuid.uuid4().hex[:8]}"
    plain = server.replace("postgresql+asyncpg://", "postgresql://")
    conn = await asyncpg.connect(plain)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    return server.rsplit("/", 1)[0] + "/" + name


async def run(args: argparse.Namespace) -> dict[str, Any]:
    url = await fresh_database(args.database_url)
    engine = make_engine(url)
    try:
        await upgrade(engine)
        sessions = make_sessionmaker(engine)
        paths: dict[str, Writer] = {"copy": write_copy, "insert": write_insert}
        sizes = (16, 500)
        samples: dict[str, dict[int, list[float]]] = {p: {s: [] for s in sizes} for p in paths}
        for path in paths.values():  # warm-up: connections, prepared statements, codecs
            await cpu_per_batch(path, sessions, 16, 3)
        for _ in range(args.rounds):
            for size in sizes:
                for name, path in paths.items():
                    batches = max(3, args.rows // size)
                    samples[name][size].append(await cpu_per_batch(path, sessions, size, batches))
            async with sessions() as session:  # the table stays small between rounds
                await session.execute(text("DELETE FROM usage_records"))
                await session.commit()
    finally:
        await engine.dispose()
    result: dict[str, Any] = {"rounds": args.rounds, "rows_per_cell": args.rows, "cells": {}}
    for name in paths:
        for size in sizes:
            batch_s = statistics.median(samples[name][size])
            result["cells"][f"{name}_{size}"] = {
                "cpu_us_per_batch": round(batch_s * 1e6, 1),
                "cpu_us_per_row": round(batch_s * 1e6 / size, 2),
            }
    cells = result["cells"]
    result["ratios"] = {
        f"insert_over_copy_{size}": round(
            cells[f"insert_{size}"]["cpu_us_per_batch"] / cells[f"copy_{size}"]["cpu_us_per_batch"],
            2,
        )
        for size in sizes
    }
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="one short round")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument(
        "--database-url",
        default=os.environ.get(
            "DATABASE_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres"
        ),
    )
    args = parser.parse_args()
    for plain in ("postgresql://", "postgres://"):
        if args.database_url.startswith(plain):
            args.database_url = "postgresql+asyncpg://" + args.database_url[len(plain) :]
    args.rounds, args.rows = (1, 500) if args.quick else (5, 5000)
    result = asyncio.run(run(args))
    print(f"{'path':8s} {'rows':>5s} {'CPU us/batch':>13s} {'CPU us/row':>11s}")
    for key, cell in result["cells"].items():
        name, size = key.split("_")
        print(
            f"{name:8s} {size:>5s} {cell['cpu_us_per_batch']:13.1f} {cell['cpu_us_per_row']:11.2f}"
        )
    for key, ratio in result["ratios"].items():
        print(f"{key}: {ratio:.2f}x")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
