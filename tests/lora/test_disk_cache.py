"""The engine's local adapter cache (lora/remote/): bounded in bytes, least recently used out
first, pinned entries kept, a restart keeps what was there. Then `FetchedAdapters` over it with
a stand-in fetcher: one fetch per hash, the hash checked before a byte is unpacked, an evicted
adapter fetched again when the engine reads it; and the HTTP fetcher against a server that cuts
its body short. No model, no torch."""

from __future__ import annotations

import hashlib
import http.server
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import pytest

from lora.adapter_format import make_bundle
from lora.errors import AdapterFetchError, AdapterNotFoundError
from lora.remote.disk_cache import DiskCache
from lora.remote.fetch import HttpBundleFetcher
from lora.remote.fetched import FetchedAdapters


def _sha(n: int) -> str:
    return hashlib.sha256(str(n).encode()).hexdigest()


def _entry(cache: DiskCache, n: int, size: int) -> Path:
    tmp = cache.new_tmp_dir()
    (tmp / "adapter_model.safetensors").write_bytes(b"w" * size)
    path = cache.insert(_sha(n), tmp)
    cache.unpin(_sha(n))
    return path


def test_least_recently_used_entries_go_first_within_the_byte_bound(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path, max_bytes=300)
    for n in range(3):
        _entry(cache, n, 100)
    assert cache.get(_sha(0)) is not None  # 0 is now the most recently used
    _entry(cache, 3, 100)
    cache.check_invariants()
    assert _sha(1) not in cache and not (tmp_path / _sha(1)).exists()  # the oldest use went
    assert all(_sha(n) in cache for n in (0, 2, 3)) and cache.num_bytes == 300
    _entry(cache, 4, 250)  # room for it takes the three others
    assert [n for n in range(5) if _sha(n) in cache] == [4]
    assert cache.stats.num_evictions == 4
    with pytest.raises(ValueError, match="exceed"):
        _entry(cache, 5, 301)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no leftovers
    cache.check_invariants()


def test_pinned_entries_are_never_evicted(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path, max_bytes=200)
    _entry(cache, 0, 100)
    assert cache.pin(_sha(0))
    _entry(cache, 1, 100)
    _entry(cache, 2, 100)  # over the bound: 1 goes, not the pinned 0
    assert _sha(0) in cache and _sha(1) not in cache
    cache.unpin(_sha(0))
    _entry(cache, 3, 100)
    assert _sha(0) not in cache  # unpinned, it was the least recently used
    assert not cache.pin(_sha(0))
    cache.check_invariants()


def test_a_restart_keeps_the_entries_and_drops_unfinished_work(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path, max_bytes=1000)
    for n in range(2):
        _entry(cache, n, 100)
    (tmp_path / ".tmp-crashed").mkdir()
    again = DiskCache(tmp_path, max_bytes=150)  # a smaller bound: the oldest goes at once
    assert again.num_bytes == 100 and not (tmp_path / ".tmp-crashed").exists()
    again.check_invariants()


@dataclass
class StandInFetcher:
    """Serves bundles from memory; `corrupt` cuts or changes what it sends."""

    bundles: dict[str, bytes]
    calls: list[str] = field(default_factory=list)
    corrupt: bool = False

    def fetch(self, adapter_id: str, out: BinaryIO, *, max_bytes: int) -> str | None:
        self.calls.append(adapter_id)
        if adapter_id not in self.bundles:
            raise AdapterNotFoundError("gone")
        data = self.bundles[adapter_id]
        out.write(data[:-700] if self.corrupt else data)
        return hashlib.sha256(data).hexdigest()


FILES = {"adapter_config.json": b'{"r": 4}', "adapter_model.safetensors": b"\1" * 3000}
BUNDLE = make_bundle(FILES)
SHA = hashlib.sha256(BUNDLE).hexdigest()


@pytest.fixture
def fetcher() -> StandInFetcher:
    return StandInFetcher({"a1": BUNDLE})


def test_an_adapter_is_fetched_once_checked_and_unpacked(
    tmp_path: Path, fetcher: StandInFetcher
) -> None:
    adapters = FetchedAdapters(DiskCache(tmp_path, max_bytes=1 << 20), fetcher)
    path = adapters.materialize("a1", SHA)
    assert {p.name: p.read_bytes() for p in Path(path).iterdir()} == FILES
    assert adapters.materialize("a1", SHA) == path
    threads = [threading.Thread(target=adapters.materialize, args=("a1", SHA)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert fetcher.calls == ["a1"] and adapters.stats.num_fetches == 1


def test_a_wrong_hash_or_a_short_body_is_refused_before_unpacking(
    tmp_path: Path, fetcher: StandInFetcher
) -> None:
    adapters = FetchedAdapters(DiskCache(tmp_path, max_bytes=1 << 20), fetcher)
    wrong = hashlib.sha256(b"other").hexdigest()
    with pytest.raises(AdapterFetchError, match=f"not the {wrong} asked for") as caught:
        adapters.materialize("a1", wrong)
    assert caught.value.status_code == 502
    fetcher.corrupt = True
    with pytest.raises(AdapterFetchError, match="refused"):
        adapters.materialize("a1", SHA)
    assert adapters.stats.num_refused == 2 and adapters.stats.num_fetches == 0
    assert [p.name for p in tmp_path.iterdir()] == []  # nothing unpacked, nothing left
    with pytest.raises(AdapterNotFoundError):
        adapters.materialize("deleted", SHA)


def test_an_entry_left_by_a_previous_process_is_checked_before_use(
    tmp_path: Path, fetcher: StandInFetcher
) -> None:
    first = FetchedAdapters(DiskCache(tmp_path, max_bytes=1 << 20), fetcher)
    path = Path(first.materialize("a1", SHA))
    restarted = FetchedAdapters(DiskCache(tmp_path, max_bytes=1 << 20), fetcher)
    assert restarted.materialize("a1", SHA) == str(path) and fetcher.calls == ["a1"]  # intact
    (path / "adapter_config.json").write_bytes(b'{"r": 64}')  # changed on disk meanwhile
    again = FetchedAdapters(DiskCache(tmp_path, max_bytes=1 << 20), fetcher)
    assert Path(again.materialize("a1", SHA)) == path and fetcher.calls == ["a1", "a1"]
    assert (path / "adapter_config.json").read_bytes() == FILES["adapter_config.json"]
    again.cache.check_invariants()


def test_an_evicted_adapter_is_fetched_again_when_the_engine_reads_it(
    tmp_path: Path, fetcher: StandInFetcher
) -> None:
    other = {**FILES, "README.md": b"another"}
    fetcher.bundles["a2"] = make_bundle(other)
    room = 3100  # one adapter's files at a time
    adapters = FetchedAdapters(DiskCache(tmp_path, max_bytes=room), fetcher)
    first = adapters.materialize("a1", SHA)
    adapters.materialize("a2", hashlib.sha256(fetcher.bundles["a2"]).hexdigest())
    assert not Path(first).exists()  # evicted for the second
    with adapters.open(first) as path:
        assert (
            path == first
            and (Path(path) / "adapter_config.json").read_bytes() == FILES["adapter_config.json"]
        )
    assert fetcher.calls == ["a1", "a2", "a1"]
    with adapters.open("/elsewhere") as path:  # a lora_path load passes through
        assert path == "/elsewhere"
    adapters.cache.check_invariants()


class _Handler(http.server.BaseHTTPRequestHandler):
    body = BUNDLE
    cut = False

    def do_GET(self) -> None:
        if self.path.endswith("/moved"):  # a redirect must not carry the token elsewhere
            self.send_response(302)
            self.send_header("location", "/internal/v1/adapters/a1")
            self.end_headers()
            return
        if self.headers.get("authorization") != "Bearer engine-token":
            self.send_error(401)
            return
        self.send_response(200)
        self.send_header("content-length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body[: len(self.body) // 2] if self.cut else self.body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[tuple[str, type[_Handler]]]:
    handler = type("Handler", (_Handler,), {})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", handler
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_the_http_fetcher_refuses_a_body_cut_short(
    tmp_path: Path, server: tuple[str, type[_Handler]]
) -> None:
    url, handler = server
    adapters = FetchedAdapters(
        DiskCache(tmp_path, max_bytes=1 << 20), HttpBundleFetcher(url, "engine-token")
    )
    assert Path(adapters.materialize("a1", SHA)).is_dir()
    handler.cut = True
    other = make_bundle({**FILES, "README.md": b"x"})
    handler.body = other
    with pytest.raises(AdapterFetchError, match="truncated"):
        adapters.materialize("a2", hashlib.sha256(other).hexdigest())
    denied = FetchedAdapters(
        DiskCache(tmp_path / "d", max_bytes=1 << 20), HttpBundleFetcher(url, "x")
    )
    with pytest.raises(AdapterFetchError, match="401"):
        denied.materialize("a1", SHA)
    with pytest.raises(AdapterFetchError, match="302"):
        adapters.materialize("moved", hashlib.sha256(b"moved").hexdigest())  # not followed
