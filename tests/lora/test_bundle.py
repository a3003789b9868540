"""The adapter bundle (lora/adapter_format/bundle.py): one canonical ustar form, so equal files
hash equal; any tar tool reads it; the strict reader refuses anything but that form (paths,
links, order, padding, trailing bytes, truncation, sizes) before writing a byte anywhere."""

from __future__ import annotations

import io
import tarfile

import pytest

from lora.adapter_format import bundle_sha256, make_bundle, read_bundle
from lora.adapter_format.bundle import BLOCK, member_header
from lora.errors import AdapterFormatError

FILES = {
    "adapter_model.safetensors": bytes(range(256)) * 3,
    "adapter_config.json": b'{"r": 8}',
    "README.md": b"hello\n",
}
# The format is a contract between the gateway (which hashes) and every engine and plugin
# (which check): a change to it changes this digest, on purpose only.
GOLDEN = "977d4698dd6f983f16de2d527090f94db68a30661cf7fe60b928f01b9a102a7d"


def test_the_same_files_give_the_same_bytes_whatever_their_order() -> None:
    reordered = dict(reversed(list(FILES.items())))
    assert make_bundle(FILES) == make_bundle(reordered)
    assert bundle_sha256(FILES) == bundle_sha256(reordered)
    assert bundle_sha256(FILES) != bundle_sha256({**FILES, "README.md": b"hello!\n"})


def test_the_digest_is_pinned() -> None:
    digest = bundle_sha256(FILES)
    if digest != GOLDEN:  # print the new one for a deliberate format change
        pytest.fail(f"the bundle format changed: sha256 {digest}")


def test_any_tar_reader_lists_it_as_plain_files() -> None:
    with tarfile.open(fileobj=io.BytesIO(make_bundle(FILES)), mode="r:") as archive:
        members = archive.getmembers()
        assert [m.name for m in members] == sorted(FILES)
        assert all(m.isfile() and m.mode == 0o644 and m.mtime == 0 for m in members)
        extracted = archive.extractfile("adapter_config.json")
        assert extracted is not None and extracted.read() == FILES["adapter_config.json"]


def test_the_reader_gives_back_the_files() -> None:
    data = make_bundle(FILES)
    assert read_bundle(io.BytesIO(data), max_bytes=10_000) == FILES


def _tar(entries: list[tarfile.TarInfo], payloads: list[bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as archive:
        for info, payload in zip(entries, payloads, strict=True):
            archive.addfile(info, io.BytesIO(payload) if info.isfile() else None)
    return out.getvalue()


def _info(name: str, size: int = 0, kind: bytes = tarfile.REGTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.type = size, kind
    return info


def _refused(data: bytes, words: str, max_bytes: int = 10_000) -> None:
    with pytest.raises(AdapterFormatError) as caught:
        read_bundle(io.BytesIO(data), max_bytes=max_bytes)
    assert words in caught.value.message


def test_paths_links_and_other_names_are_refused() -> None:
    _refused(_tar([_info("../adapter_config.json", 2)], [b"{}"]), "not an adapter file")
    _refused(_tar([_info("/etc/passwd", 2)], [b"{}"]), "not an adapter file")
    _refused(_tar([_info("x/adapter_config.json", 2)], [b"{}"]), "not an adapter file")
    _refused(_tar([_info("adapter_model.bin", 2)], [b"{}"]), "not an adapter file")
    link = _info("adapter_config.json", kind=tarfile.SYMTYPE)
    link.linkname = "/etc/passwd"
    _refused(_tar([link], [b""]), "canonical form")
    _refused(_tar([_info("README.md", kind=tarfile.DIRTYPE)], [b""]), "canonical form")


def test_other_forms_of_the_same_files_are_refused() -> None:
    # what tarfile writes by default: the owner's names, a modification time
    plain = io.BytesIO()
    with tarfile.open(fileobj=plain, mode="w", format=tarfile.USTAR_FORMAT) as archive:
        info = tarfile.TarInfo("adapter_config.json")
        info.size, info.mtime = 2, 1_700_000_000
        archive.addfile(info, io.BytesIO(b"{}"))
    _refused(plain.getvalue(), "canonical form")

    def entry(name: str, data: bytes) -> bytes:
        return member_header(name, len(data)) + data + bytes(-len(data) % BLOCK)

    end = bytes(2 * BLOCK)
    _refused(entry("adapter_config.json", b"{}") + entry("README.md", b"x") + end, "order")
    _refused(entry("README.md", b"x") + entry("README.md", b"x") + end, "repeated")


def test_truncation_trailing_bytes_padding_and_size_are_refused() -> None:
    data = make_bundle(FILES)
    _refused(data[:-1], "truncated")
    _refused(data[: len(data) // 2], "truncated")
    _refused(data + b"\0", "follow its end")
    size = len(FILES["README.md"])
    padded = member_header("README.md", size) + FILES["README.md"] + b"x" * (BLOCK - size)
    _refused(padded + bytes(2 * BLOCK), "padded with data")
    _refused(data, "exceed", max_bytes=100)
