"""Triton kernels with a PyTorch reference for each (the reference is also the CPU path)."""
