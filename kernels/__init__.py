"""The engine's kernels: `triton/` (the LoRA kernels on CUDA and their dispatch) and `cpu/` (the CPU
path: Python wrappers over the hand-written C++ in `cpu/native/`, and the PyTorch references)."""
