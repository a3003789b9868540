"""The CPU path: Python wrappers of the hand-written kernels (sources in `native/`), the LoRA reference, and what the machine offers (oneDNN, huge pages)."""
