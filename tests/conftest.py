"""Test-wide setup. TRITON_INTERPRET must be set before any kernel module is imported."""

from __future__ import annotations

import os

# Triton kernels run on CPU only through the interpreter; it is read when triton loads.
os.environ.setdefault("TRITON_INTERPRET", "1")
# Tests never reach a model hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
