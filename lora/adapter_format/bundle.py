"""An adapter's files as one canonical byte string, the unit the store keeps, hashes and ships.

The bundle is an uncompressed POSIX ustar archive, written one way only, so equal files give
equal bytes and `sha256(bundle)` is the adapter's content address:

    for each file, in ascending order of name (only adapter_config.json,
    adapter_model.safetensors and README.md, each at the top level):
        a 512-byte ustar header: the name, mode 0644, uid and gid 0, size, mtime 0, type '0'
        (a regular file), magic "ustar\\0" version "00", empty user and group names
        the file's bytes, then zero bytes up to a multiple of 512
    two 512-byte blocks of zeros (the end of the archive), and nothing after them

Any tar tool lists or unpacks it (`tar -tvf`). Readers here accept exactly that form and
nothing else (`iter_bundle`): headers are checked field by field, names must ascend, links,
directories, devices and paths are refused, and the sizes are bounded before a byte is read.
A reader checks the bundle's hash before it parses it; the strictness is the second wall.
"""

from __future__ import annotations

import hashlib
import tarfile
from collections.abc import Iterator, Mapping
from typing import BinaryIO

from lora.adapter_format.peft_config import CONFIG_FILE
from lora.adapter_format.safetensors_header import WEIGHTS_FILE
from lora.errors import AdapterFormatError

BUNDLE_FILES = frozenset({CONFIG_FILE, WEIGHTS_FILE, "README.md"})
BLOCK = 512
END = BUNDLE_END = bytes(2 * BLOCK)
CHUNK = BUNDLE_CHUNK = 1 << 20  # how much a reader or a stream moves at once


def member_header(name: str, size: int) -> bytes:
    """The canonical header of one file (what `tarfile` writes for these fixed fields)."""
    if name not in BUNDLE_FILES:
        raise ValueError(f"{name!r} is not a bundle file")
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime, info.uid, info.gid = size, 0o644, 0, 0, 0
    info.uname = info.gname = ""
    info.type = tarfile.REGTYPE
    return info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "strict")


def padding(size: int) -> bytes:
    return bytes(-size % BLOCK)


bundle_padding = padding


def bundle_size(sizes: Mapping[str, int]) -> int:
    return sum(BLOCK + size + len(padding(size)) for size in sizes.values()) + len(END)


def iter_chunks(files: Mapping[str, bytes]) -> Iterator[bytes]:
    """The bundle of in-memory files, piece by piece (a header, a file, its padding, ...)."""
    for name in sorted(files):
        data = files[name]
        yield member_header(name, len(data))
        yield data
        yield padding(len(data))
    yield END


def make_bundle(files: Mapping[str, bytes]) -> bytes:
    return b"".join(iter_chunks(files))


def bundle_sha256(files: Mapping[str, bytes]) -> str:
    digest = hashlib.sha256()
    for chunk in iter_chunks(files):
        digest.update(chunk)
    return digest.hexdigest()


def _refuse(why: str) -> AdapterFormatError:
    return AdapterFormatError(f"the adapter bundle is malformed: {why}", param="lora_sha256")


def _read_exact(src: BinaryIO, n: int) -> bytes:
    data = src.read(n)
    if len(data) != n:
        raise _refuse("it ends early (truncated)")
    return data


def _parse_header(block: bytes, previous: str) -> tuple[str, int]:
    """(name, size) of a canonical header; anything else is refused."""
    try:
        info = tarfile.TarInfo.frombuf(block, "utf-8", "strict")
    except tarfile.HeaderError as exc:
        raise _refuse("a header is damaged") from exc
    name = info.name
    if name not in BUNDLE_FILES:
        raise _refuse(f"entry {name[:80]!r} is not an adapter file")
    if name <= previous:
        raise _refuse("entries are repeated or out of order")
    if info.size < 0 or block != member_header(name, info.size):
        raise _refuse(f"entry {name!r} is not a plain file in canonical form")
    return name, info.size


def iter_bundle(src: BinaryIO, *, max_bytes: int) -> Iterator[tuple[str, int, Iterator[bytes]]]:
    """Each file as (name, size, its bytes in chunks); each chunk iterator must be drained before
    the next file. The sum of the sizes is at most `max_bytes`; the archive must end exactly
    after its two end blocks."""
    previous, total = "", 0
    while True:
        block = _read_exact(src, BLOCK)
        if block == bytes(BLOCK):
            if _read_exact(src, BLOCK) != bytes(BLOCK) or src.read(1):
                raise _refuse("bytes follow its end")
            return
        name, size = _parse_header(block, previous)
        total += size
        if total > max_bytes:
            raise _refuse(f"its files exceed {max_bytes} bytes")
        previous = name
        yield name, size, _member_chunks(src, size)
        if _read_exact(src, len(padding(size))) != padding(size):
            raise _refuse(f"entry {name!r} is padded with data")


def _member_chunks(src: BinaryIO, size: int) -> Iterator[bytes]:
    left = size
    while left:
        chunk = _read_exact(src, min(CHUNK, left))
        left -= len(chunk)
        yield chunk


def read_bundle(src: BinaryIO, *, max_bytes: int) -> dict[str, bytes]:
    """The bundle's files in memory (checked as `iter_bundle` checks them)."""
    return {name: b"".join(chunks) for name, _, chunks in iter_bundle(src, max_bytes=max_bytes)}
