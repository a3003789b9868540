"""Typed adapter errors. Each names the problem; the engine maps them once, at its boundary,
to an HTTP status (`status_code`): bad adapters and names are 400, unknown names 404, a name
taken by another path 409."""

from __future__ import annotations


class AdapterError(Exception):
    """Base of every adapter error a client can cause."""

    status_code = 400

    def __init__(self, message: str, *, param: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param


class AdapterFormatError(AdapterError):
    """The directory or a file in it is missing, unreadable, too large or malformed."""


class PickleRejectedError(AdapterError):
    """The adapter ships pickle weights (.bin, .pt, ...), which are never read."""


class AdapterConfigError(AdapterError):
    """adapter_config.json asks for something loragate cannot serve (DoRA, modules_to_save...)."""


class AdapterRankError(AdapterConfigError):
    """A rank (r or a rank_pattern value) is above max_lora_rank."""


class AdapterTargetError(AdapterConfigError):
    """target_modules names modules other than the seven Llama projections."""


class AdapterBaseModelError(AdapterError):
    """The adapter was made for another base model (name, layer count or tensor shapes)."""


class AdapterTensorError(AdapterError):
    """A tensor is unexpected, unpaired, of the wrong shape or dtype, or not finite."""


class SafetensorsHeaderError(AdapterFormatError):
    """The safetensors header lies: too large, offsets past the end, sizes that do not add up."""


class AdapterNameError(AdapterError):
    """An adapter name that is empty, too long, or holds separators or control characters."""


class AdapterNotFoundError(AdapterError):
    """No adapter of that name is registered."""

    status_code = 404


class AdapterConflictError(AdapterError):
    """The name is registered for a different path."""

    status_code = 409


class AdapterFetchError(AdapterError):
    """An adapter's bundle could not be fetched from the gateway's store, or its bytes were
    refused (a hash other than the one asked for, a truncated transfer): the store, upstream of
    the engine, failed; nothing of it was unpacked or loaded."""

    status_code = 502
