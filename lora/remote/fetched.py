"""Adapters by id and hash, made local: `materialize` fetches a bundle (once per hash, however
many threads ask), checks its sha256 BEFORE parsing a byte of it, unpacks it strictly into the
disk cache and returns the directory the LoRA loader reads.

The disk cache may evict an adapter the engine still has registered (its CPU tier then reads
it again later): `open(path)` pins the entry while the loader reads it and fetches it again if
it was evicted, so the engine's registry can keep the path for the adapter's whole life.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import shutil
import tempfile
import threading
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from lora.adapter_format.bundle import BUNDLE_FILES, bundle_sha256, iter_bundle
from lora.errors import AdapterError, AdapterFetchError, AdapterFormatError
from lora.remote.disk_cache import DiskCache, is_sha256
from lora.remote.fetch import BundleFetcher

log = logging.getLogger(__name__)


@dataclass
class FetchStats:
    num_fetches: int = 0  # bundles fetched, checked and unpacked
    num_refused: int = 0  # fetched, then refused (hash, truncation, format)
    num_bytes: int = 0  # of the bundles fetched


class _HashingWriter:
    def __init__(self, out: BinaryIO) -> None:
        self.out = out
        self.digest = hashlib.sha256()
        self.num_bytes = 0

    def write(self, data: bytes) -> int:
        self.digest.update(data)
        self.num_bytes += len(data)
        return self.out.write(data)


class FetchedAdapters:
    def __init__(
        self, cache: DiskCache, fetcher: BundleFetcher, *, max_bundle_bytes: int = 4 << 30
    ) -> None:
        self.cache = cache
        self.fetcher = fetcher
        self.max_bundle_bytes = max_bundle_bytes
        self.stats = FetchStats()
        self._sources: dict[str, tuple[str, str]] = {}  # directory -> (adapter id, sha256)
        self._locks: dict[str, threading.Lock] = {}  # per sha256: one fetch at a time
        self._guard = threading.Lock()
        self._by_id: dict[str, str] = {}  # adapter id -> sha256, from materialize_reported

    def materialize(self, adapter_id: str, sha256: str) -> str:
        """The local directory of `adapter_id`'s files whose bundle hashes to `sha256`."""
        if not is_sha256(sha256):
            raise AdapterFormatError(
                "lora_sha256 must be 64 lowercase hex digits", param="lora_sha256"
            )
        with self._lock_for(sha256):
            path = self.cache.get(sha256)
            if path is not None and not self.cache.is_verified(sha256):
                if _dir_sha256(path) == sha256:  # left by a previous process: check it once
                    self.cache.mark_verified(sha256)
                else:
                    log.warning("cached adapter %s changed on disk; fetching it again", sha256)
                    self.cache.discard(sha256)
                    path = None
            if path is None:
                path = self._fetch(adapter_id, sha256)
                self.cache.unpin(sha256)
        with self._guard:
            self._sources[str(path)] = (adapter_id, sha256)
        return str(path)

    def materialize_reported(self, adapter_id: str) -> str:
        """For a caller that knows only the id (vLLM's resolver): the hash checked is the one
        the store sends with the bytes (ids are immutable versions, so it is remembered)."""
        with self._guard:
            known = self._by_id.get(adapter_id)
        if known is not None:
            return self.materialize(adapter_id, known)
        with self._lock_for("id:" + adapter_id):
            path = self._fetch(adapter_id, None)
            self.cache.unpin(path.name)
        with self._guard:
            self._sources[str(path)] = (adapter_id, path.name)
        return str(path)

    @contextlib.contextmanager
    def open(self, path: str) -> Iterator[str]:
        """`path`, present and kept from eviction while the block runs (fetched again if the
        cache dropped it); a path not from `materialize` passes through untouched."""
        with self._guard:
            source = self._sources.get(path)
        if source is None:
            yield path
            return
        adapter_id, sha256 = source
        with self._lock_for(sha256):
            if not self.cache.pin(sha256):
                self._fetch(adapter_id, sha256)  # inserted pinned
        try:
            yield path
        finally:
            self.cache.unpin(sha256)

    def _lock_for(self, sha256: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(sha256, threading.Lock())

    def _fetch(self, adapter_id: str, expected: str | None) -> Path:
        """Fetch, check (against `expected`, else the hash the store reports), unpack, insert
        (pinned). The caller holds the hash's lock."""
        with tempfile.TemporaryFile(dir=self.cache.root) as spool:
            writer = _HashingWriter(spool)
            try:
                reported = self.fetcher.fetch(adapter_id, writer, max_bytes=self.max_bundle_bytes)  # type: ignore[arg-type]
                sha256 = expected or reported
                if not is_sha256(sha256):
                    raise AdapterFetchError(
                        f"adapter {adapter_id[:80]!r}: the store sent no hash to check; refused",
                        param="lora_name",
                    )
                assert sha256 is not None
                got = writer.digest.hexdigest()
                if got != sha256:
                    raise AdapterFetchError(
                        f"adapter {adapter_id[:80]!r}: the bundle fetched ({writer.num_bytes} "
                        f"bytes) hashes to sha256 {got}, not the {sha256} asked for; refused",
                        param="lora_sha256",
                    )
                spool.seek(0)
                tmp = self.cache.new_tmp_dir()
                try:
                    _unpack(spool, tmp, max_bytes=self.max_bundle_bytes)
                except BaseException:
                    shutil.rmtree(tmp, ignore_errors=True)
                    raise
            except AdapterError as exc:
                self.stats.num_refused += exc.status_code != 404
                log.warning("adapter %s not fetched: %s", adapter_id[:80], exc.message)
                raise
        if not self.cache.can_insert(sum(f.stat().st_size for f in tmp.iterdir())):
            shutil.rmtree(tmp, ignore_errors=True)
            raise AdapterFetchError(
                f"adapter {adapter_id[:80]!r} is larger than the adapter cache", param="lora_name"
            )
        path = self.cache.insert(sha256, tmp)
        with self._guard:
            self._by_id[adapter_id] = sha256
        self.stats.num_fetches += 1
        self.stats.num_bytes += writer.num_bytes
        log.info(
            "fetched adapter %s (sha256 %s, %d bytes, hash checked)",
            adapter_id[:80], sha256[:16], writer.num_bytes,
        )  # fmt: skip
        return path


def fetched_adapters(
    cache_dir: str | None, max_bytes: int, fetcher: BundleFetcher
) -> FetchedAdapters:
    """Over a disk cache at `cache_dir` (kept across restarts), or a fresh temporary directory
    removed when the process ends."""
    root = Path(cache_dir) if cache_dir else Path(tempfile.mkdtemp(prefix="loragate-adapters-"))
    adapters = FetchedAdapters(DiskCache(root, max_bytes=max_bytes), fetcher)
    if not cache_dir:
        weakref.finalize(adapters, shutil.rmtree, root, True)
    return adapters


def _dir_sha256(path: Path) -> str | None:
    """The bundle hash of an unpacked directory's files; None if it holds anything else."""
    try:
        files = {f.name: f.read_bytes() for f in path.iterdir()}
    except OSError:
        return None
    return bundle_sha256(files) if files.keys() <= BUNDLE_FILES else None


def _unpack(src: BinaryIO, dest: Path, *, max_bytes: int) -> None:
    for name, _, chunks in iter_bundle(src, max_bytes=max_bytes):
        # `name` is one of three fixed file names (iter_bundle refuses any other): no path
        # from the bundle ever reaches the filesystem.
        with open(dest / name, "xb") as f:
            for chunk in chunks:
                f.write(chunk)
