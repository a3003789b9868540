"""The engine loop: the synchronous engine (admit, step, emit deltas), the thread that owns it, and the async face that coroutines talk to."""
