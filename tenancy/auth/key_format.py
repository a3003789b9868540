"""API key format and hashing: `<prefix>_<43 base62 chars of 256 random bits><6-char checksum>`.

The checksum (CRC32 of everything before it) lets malformed or mistyped keys be refused without
a database lookup, and lets secret scanners recognise leaked keys. Keys are stored only as
HMAC-SHA256 under the server pepper; the clear key exists only in the creation response.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import zlib
from dataclasses import dataclass

_ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_DIGITS = frozenset(_ALPHABET)
_BODY_LEN = 43  # ceil(256 / log2(62))
_CHECK_LEN = 6
# Long enough to hold any valid key; anything longer is refused before hashing.
MAX_KEY_LEN = 64


def _base62(value: int, width: int) -> str:
    chars = []
    for _ in range(width):
        value, digit = divmod(value, 62)
        chars.append(_ALPHABET[digit])
    if value:
        raise ValueError("value does not fit the width")
    return "".join(reversed(chars))


def _checksum(head: str) -> str:
    return _base62(zlib.crc32(head.encode("ascii")), _CHECK_LEN)


@dataclass(frozen=True)
class KeyParts:
    """What may be stored and shown about a key: never enough to reconstruct it."""

    prefix: str  # e.g. "lg_Ab3dE9xQ": the readable prefix plus 8 characters
    last_four: str

    @property
    def masked(self) -> str:
        return f"{self.prefix}...{self.last_four}"


def generate_key(prefix: str) -> str:
    body = _base62(secrets.randbits(256), _BODY_LEN)
    head = f"{prefix}_{body}"
    return head + _checksum(head)


def is_well_formed(raw: str, prefix: str) -> bool:
    """Shape and checksum only; runs in time independent of any stored key."""
    if len(raw) != len(prefix) + 1 + _BODY_LEN + _CHECK_LEN or not raw.isascii():
        return False
    if not raw.startswith(prefix + "_"):
        return False
    tail = raw[len(prefix) + 1 :]
    if not _DIGITS.issuperset(tail):  # one C loop: this runs on every request
        return False
    head, check = raw[:-_CHECK_LEN], raw[-_CHECK_LEN:]
    return hmac.compare_digest(_checksum(head), check)


def key_parts(raw: str, prefix: str) -> KeyParts:
    return KeyParts(prefix=raw[: len(prefix) + 1 + 8], last_four=raw[-4:])


def hash_key(raw: str, pepper: bytes) -> str:
    return hmac.new(pepper, raw.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()


def digests_equal(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode("ascii"), b.encode("ascii"))


@dataclass(frozen=True)
class MintedKey:
    clear: str  # shown once, in the creation response; never stored or logged
    parts: KeyParts
    key_hash: str


@dataclass(frozen=True)
class KeyMinter:
    prefix: str
    pepper: bytes

    def mint(self) -> MintedKey:
        clear = generate_key(self.prefix)
        return MintedKey(
            clear=clear, parts=key_parts(clear, self.prefix), key_hash=self.hash(clear)
        )

    def hash(self, raw: str) -> str:
        return hash_key(raw, self.pepper)

    def is_well_formed(self, raw: str) -> bool:
        return is_well_formed(raw, self.prefix)
