"""Unpacked adapters on local disk, keyed by their bundle's sha256, bounded in bytes (LRU).

Layout: `<root>/<sha256>/{adapter_config.json, adapter_model.safetensors, README.md?}`. An entry
appears whole or not at all: it is unpacked into `<root>/.tmp-*` and renamed into place, and an
evicted one is renamed to `<root>/.gone-*` before it is deleted, so a reader never sees half a
directory under a hash's name.

Invariants (check_invariants): the entries' bytes add up to `num_bytes`; `num_bytes` is at most
`max_bytes` except while pinned entries alone exceed it; a pinned entry (an engine reading it)
is never evicted. Eviction takes the least recently used unpinned entry first.

Plain Python and the filesystem; thread-safe (a lock around the bookkeeping); the engine's
reader thread and the load endpoint's worker threads share one cache.
"""

from __future__ import annotations

import re
import shutil
import threading
import uuid
from collections import Counter, OrderedDict
from dataclasses import dataclass
from pathlib import Path

_SHA = re.compile(r"[0-9a-f]{64}")


def is_sha256(value: object) -> bool:
    return isinstance(value, str) and _SHA.fullmatch(value) is not None


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file())


@dataclass
class DiskCacheStats:
    num_hits: int = 0
    num_inserts: int = 0
    num_evictions: int = 0


class DiskCache:
    def __init__(self, root: Path, *, max_bytes: int) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1, got {max_bytes}")
        self.root = root
        self.max_bytes = max_bytes
        self.num_bytes = 0
        self.stats = DiskCacheStats()
        self._entries: OrderedDict[str, int] = OrderedDict()  # sha -> bytes, oldest use first
        self._pins: Counter[str] = Counter()
        self._unverified: set[str] = set()  # adopted from a previous process, not yet checked
        self._lock = threading.Lock()
        root.mkdir(parents=True, exist_ok=True)
        self._adopt_existing()

    def _adopt_existing(self) -> None:
        """Entries a previous process left are kept (oldest first by mtime) but marked
        unverified: the fetch layer hashes one again before its first use (FetchedAdapters),
        since the disk may have changed under it. Leftovers of unfinished unpacks and evictions
        are removed."""
        found = []
        for path in self.root.iterdir():
            if path.is_dir() and is_sha256(path.name):
                found.append((path.stat().st_mtime, path.name, dir_bytes(path)))
            elif path.name.startswith((".tmp-", ".gone-")):
                shutil.rmtree(path, ignore_errors=True)
        for _, sha, size in sorted(found):
            self._entries[sha] = size
            self._unverified.add(sha)
            self.num_bytes += size
        with self._lock:
            self._evict_locked()

    def path_of(self, sha: str) -> Path:
        if not is_sha256(sha):
            raise ValueError("not a sha256 hex digest")
        return self.root / sha

    def get(self, sha: str) -> Path | None:
        """The entry's directory (now the most recently used), or None."""
        with self._lock:
            if sha not in self._entries:
                return None
            self._entries.move_to_end(sha)
            self.stats.num_hits += 1
            return self.path_of(sha)

    def is_verified(self, sha: str) -> bool:
        with self._lock:
            return sha not in self._unverified

    def mark_verified(self, sha: str) -> None:
        with self._lock:
            self._unverified.discard(sha)

    def discard(self, sha: str) -> None:
        """Drop an entry now (one that failed its check); a pinned one cannot be dropped."""
        with self._lock:
            if sha in self._entries and self._pins[sha] <= 0:
                self._drop_locked(sha)

    def __contains__(self, sha: str) -> bool:
        with self._lock:
            return sha in self._entries

    def new_tmp_dir(self) -> Path:
        tmp = self.root / f".tmp-{uuid.uuid4().hex}"
        tmp.mkdir()
        return tmp

    def can_insert(self, num_bytes: int) -> bool:
        return num_bytes <= self.max_bytes

    def insert(self, sha: str, tmp_dir: Path) -> Path:
        """Move an unpacked `tmp_dir` in as `sha` (pinned once: the caller unpins), evicting
        least recently used entries to make room. ValueError if it alone exceeds the bound."""
        size = dir_bytes(tmp_dir)
        if not self.can_insert(size):
            shutil.rmtree(tmp_dir, ignore_errors=True)
            raise ValueError(f"{size} bytes exceed the adapter cache's {self.max_bytes}")
        final = self.path_of(sha)
        with self._lock:
            if sha in self._entries:  # another thread unpacked the same bundle first
                shutil.rmtree(tmp_dir, ignore_errors=True)
            else:
                shutil.rmtree(final, ignore_errors=True)  # an untracked leftover
                tmp_dir.rename(final)
                self._entries[sha] = size
                self.num_bytes += size
                self.stats.num_inserts += 1
            self._entries.move_to_end(sha)
            self._pins[sha] += 1
            self._evict_locked()
        return final

    def pin(self, sha: str) -> bool:
        """Keep `sha` from eviction until `unpin`; False (nothing pinned) if it is not here."""
        with self._lock:
            if sha not in self._entries:
                return False
            self._entries.move_to_end(sha)
            self._pins[sha] += 1
            return True

    def unpin(self, sha: str) -> None:
        with self._lock:
            self._pins[sha] -= 1
            if self._pins[sha] <= 0:
                del self._pins[sha]
            self._evict_locked()

    def _evict_locked(self) -> None:
        for sha in list(self._entries):
            if self.num_bytes <= self.max_bytes:
                return
            if self._pins[sha] > 0:
                continue
            self.stats.num_evictions += 1
            self._drop_locked(sha)

    def _drop_locked(self, sha: str) -> None:
        self.num_bytes -= self._entries.pop(sha)
        self._unverified.discard(sha)
        gone = self.root / f".gone-{uuid.uuid4().hex}"
        try:
            self.path_of(sha).rename(gone)
        except OSError:
            return  # already gone: the bookkeeping is what matters
        shutil.rmtree(gone, ignore_errors=True)

    def check_invariants(self) -> None:
        with self._lock:
            assert self.num_bytes == sum(self._entries.values())
            pinned = sum(size for sha, size in self._entries.items() if self._pins[sha] > 0)
            assert self.num_bytes <= max(self.max_bytes, pinned)
            for sha in self._entries:
                assert self.path_of(sha).is_dir(), sha
