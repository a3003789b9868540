"""Tokens-only inference engine: scheduler, paged KV cache, model runner, sampler, server."""
