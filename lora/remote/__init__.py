"""Adapters fetched from the gateway's store: the bundle fetch over HTTP with its hash check,
and the local disk cache (bounded in bytes, least recently used first) they are unpacked into.
Torch-free, so vLLM's resolver plugin (lora/remote/vllm_plugin.py) uses the same code."""
