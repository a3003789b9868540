"""`loragate admin adapters upload DIR|ARCHIVE`: a streamed multipart upload with a progress bar.

The body is produced in chunks as it is sent (files are never read whole into memory), with an
exact Content-Length computed beforehand, and the bar advances by the bytes actually handed to
the connection. The server checks everything (allowed files, archive safety, the PEFT config,
tensor shapes and values); its refusal is shown as it is, with the field it names.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TransferSpeedColumn,
)

from tenancy.admin_cli.client import AdminClient

CHUNK = 256 * 1024
ARCHIVES = (".zip", ".tar.gz", ".tgz")


@dataclass(frozen=True)
class Part:
    head: bytes
    path: Path | None  # the file's bytes follow the head; None: the head is the whole part
    size: int


def files_of(source: Path) -> list[Path]:
    """A PEFT directory's regular files (the server decides which are allowed), or one archive."""
    if source.is_dir():
        files = sorted(p for p in source.iterdir() if p.is_file() and not p.is_symlink())
        if not files:
            raise ValueError(f"{source} holds no files")
        return files
    if source.is_file():
        return [source]
    raise ValueError(f"{source}: no such file or directory")


def _parts(
    name: str,
    files: list[Path],
    boundary: str,
    *,
    activate: bool = True,
    base_model: str | None = None,
) -> list[Part]:
    fields = {"name": name, "activate": "true" if activate else "false"}
    if base_model is not None:  # unset: the server's primary base model
        fields["base_model"] = base_model
    parts = [Part(
        f'--{boundary}\r\nContent-Disposition: form-data; name="{field}"\r\n\r\n{value}'.encode(),
        None, 0,
    ) for field, value in fields.items()]  # fmt: skip
    for path in files:
        filename = path.name.replace('"', "_")
        head = (
            f'--{boundary}\r\nContent-Disposition: form-data; name="files"; '
            f'filename="{filename}"\r\nContent-Type: application/octet-stream\r\n\r\n'
        ).encode()
        parts.append(Part(head, path, path.stat().st_size))
    return parts


def upload(
    client: AdminClient,
    path: str,
    *,
    name: str,
    source: Path,
    quiet: bool,
    activate: bool = True,
    base_model: str | None = None,
) -> object:
    """`activate` False: the new version is staged, the name's alias stays where it is."""
    files = files_of(source)
    boundary = "lgboundary" + secrets.token_hex(12)
    parts = _parts(name, files, boundary, activate=activate, base_model=base_model)
    tail = f"--{boundary}--\r\n".encode()
    length = sum(len(p.head) + p.size + 2 for p in parts) + len(tail)
    progress = Progress(
        TextColumn("[bold]upload[/] {task.description}"), BarColumn(), DownloadColumn(),
        TransferSpeedColumn(), console=Console(stderr=True), disable=quiet,
    )  # fmt: skip
    described = source.name + ("" if len(files) == 1 else f" ({len(files)} files)")

    def body(task: TaskID) -> Iterator[bytes]:
        for part in parts:
            yield part.head
            progress.advance(task, len(part.head))
            if part.path is not None:
                with part.path.open("rb") as f:
                    while chunk := f.read(CHUNK):
                        yield chunk
                        progress.advance(task, len(chunk))
            yield b"\r\n"
            progress.advance(task, 2)
        yield tail
        progress.advance(task, len(tail))

    with progress:
        task = progress.add_task(described, total=length)
        return client.call(
            "POST", path, content=body(task),
            headers={"content-type": f"multipart/form-data; boundary={boundary}",
                     "content-length": str(length)},
        )  # fmt: skip
