"""Grammar-constrained decoding (vLLM's `structured_outputs`) on llguidance.

`spec` validates what a request asks for (torch-free: the gateway checks it too); `compiler`
turns a spec into a compiled grammar off the engine loop, cached and bounded; `matcher` follows
one sequence through its grammar; `masks` turns the step's matchers into a token bitmask and
applies it to the logits rows. docs/architecture.md#structured-outputs says why llguidance.
"""
