"""Turn an upload (PEFT files, or one .zip / .tar.gz) into {allowed name: bytes}, in memory.

Every entry is checked before anything is read out of an archive, and nothing is ever written to
disk here: names on the allow-list only (so never a pickle), no `..`, absolute paths, links or
devices, a cap on the number of files, on the total size and on the compression ratio. Sizes
declared by an archive are not trusted: reads are bounded by the cap and compared.
"""

from __future__ import annotations

import io
import posixpath
import tarfile
import zipfile
import zlib
from dataclasses import dataclass

from lora.adapter_format import CONFIG_FILE, WEIGHTS_FILE
from tenancy.adapters.errors import AdapterRejected
from tenancy.settings import AdapterLimits

ALLOWED = frozenset({CONFIG_FILE, WEIGHTS_FILE, "README.md"})
REQUIRED = frozenset({CONFIG_FILE, WEIGHTS_FILE})
_ARCHIVE_SUFFIXES = (".zip", ".tar.gz", ".tgz")


@dataclass(frozen=True)
class UploadedFile:
    filename: str
    data: bytes


def _allowed_name(name: str, *, in_archive: bool) -> str:
    if "\x00" in name or "\\" in name or name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise AdapterRejected(f"Entry {name[:80]!r} has an absolute or invalid path.")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise AdapterRejected(f"Entry {name[:80]!r} escapes the archive ('..').")
    if len(parts) > (2 if in_archive else 1):
        raise AdapterRejected(f"Entry {name[:80]!r} is nested too deep.")
    base = parts[-1] if parts else ""
    if base not in ALLOWED:
        raise AdapterRejected(
            f"File {base[:80]!r} is not allowed; an adapter holds only {sorted(ALLOWED)}"
            " (never pickle files such as .bin or .pt)."
        )
    return base


def _put(files: dict[str, bytes], name: str, data: bytes) -> None:
    if name in files:
        raise AdapterRejected(f"File {name!r} appears twice.")
    files[name] = data


def _from_zip(data: bytes, limits: AdapterLimits) -> dict[str, bytes]:
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        infos = archive.infolist()
    except (zipfile.BadZipFile, ValueError) as exc:
        raise AdapterRejected("The .zip archive is corrupt.") from exc
    if len(infos) > limits.max_files:
        raise AdapterRejected(f"The archive holds more than {limits.max_files} entries.")
    wanted: list[tuple[zipfile.ZipInfo, str]] = []
    total = 0
    for info in infos:
        mode = (info.external_attr >> 16) & 0o170000
        if mode == 0o120000:
            raise AdapterRejected(f"Entry {info.filename[:80]!r} is a symbolic link.")
        if info.is_dir():
            _allowed_dir(info.filename)
            continue
        name = _allowed_name(info.filename, in_archive=True)
        total += info.file_size
        if total > limits.max_upload_bytes:
            raise AdapterRejected("The archive's uncompressed size exceeds the limit.")
        if info.file_size > max(info.compress_size, 1) * limits.max_compression_ratio:
            raise AdapterRejected(f"Entry {name!r} exceeds the compression ratio limit (zip bomb).")
        wanted.append((info, name))
    files: dict[str, bytes] = {}
    for info, name in wanted:
        try:
            with archive.open(info) as f:
                content = f.read(info.file_size + 1)
        except (zipfile.BadZipFile, zlib.error, NotImplementedError, RuntimeError) as exc:
            raise AdapterRejected(f"Entry {name!r} cannot be read.") from exc
        if len(content) != info.file_size:
            raise AdapterRejected(f"Entry {name!r} is larger than the archive declares.")
        _put(files, name, content)
    return files


def _allowed_dir(name: str) -> None:
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if name.startswith("/") or ".." in parts or len(parts) > 1:
        raise AdapterRejected(f"Directory entry {name[:80]!r} is not allowed.")


def _gunzip(data: bytes, limits: AdapterLimits) -> bytes:
    cap = min(limits.max_upload_bytes, int(len(data) * limits.max_compression_ratio))
    inflater = zlib.decompressobj(wbits=31)
    try:
        raw = inflater.decompress(data, cap + 1)
    except zlib.error as exc:
        raise AdapterRejected("The .tar.gz archive is corrupt.") from exc
    if len(raw) > cap or inflater.unconsumed_tail:
        raise AdapterRejected("The archive exceeds the size or compression ratio limit (zip bomb).")
    return raw


def _from_targz(data: bytes, limits: AdapterLimits) -> dict[str, bytes]:
    raw = _gunzip(data, limits)
    try:
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as archive:
            return _tar_members(archive, limits)
    except tarfile.TarError as exc:
        raise AdapterRejected("The tar archive is corrupt.") from exc


def _tar_members(archive: tarfile.TarFile, limits: AdapterLimits) -> dict[str, bytes]:
    members = archive.getmembers()
    if len(members) > limits.max_files:
        raise AdapterRejected(f"The archive holds more than {limits.max_files} entries.")
    for m in members:
        if m.issym() or m.islnk():
            raise AdapterRejected(f"Entry {m.name[:80]!r} is a link.")
        if m.isdir():
            _allowed_dir(m.name)
        elif not m.isfile():
            raise AdapterRejected(f"Entry {m.name[:80]!r} is not a regular file.")
        else:
            _allowed_name(m.name, in_archive=True)
    files: dict[str, bytes] = {}
    for m in members:
        if m.isfile():
            f = archive.extractfile(m)
            assert f is not None
            _put(files, _allowed_name(m.name, in_archive=True), f.read(m.size))
    return files


def collect_files(uploads: list[UploadedFile], limits: AdapterLimits) -> dict[str, bytes]:
    if not uploads:
        raise AdapterRejected("No files were uploaded.")
    if sum(len(u.data) for u in uploads) > limits.max_upload_bytes:
        raise AdapterRejected("The upload exceeds the size limit.")
    if len(uploads) > limits.max_files:
        raise AdapterRejected(f"More than {limits.max_files} files were uploaded.")
    archives = [u for u in uploads if u.filename.lower().endswith(_ARCHIVE_SUFFIXES)]
    if archives:
        if len(uploads) != 1:
            raise AdapterRejected("Upload either one archive or the adapter files, not both.")
        upload = archives[0]
        name = posixpath.basename(upload.filename.lower())
        files = _from_zip(upload.data, limits) if name.endswith(".zip") else None
        if files is None:
            files = _from_targz(upload.data, limits)
    else:
        files = {}
        for upload in uploads:
            _put(files, _allowed_name(upload.filename, in_archive=False), upload.data)
    missing = REQUIRED - files.keys()
    if missing:
        raise AdapterRejected(f"Missing required file(s): {sorted(missing)}.")
    return files
