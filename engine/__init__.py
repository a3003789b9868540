"""Tokens-only inference engine. Rooms: `loop/` (the engine and the thread that owns it),
`scheduling/` (what runs each step), `step/` (one forward pass), `sampling/` and `structured/`
(tokens from logits), `protocol/` and `server.py` (vLLM's wire protocol over HTTP), `models/`."""
