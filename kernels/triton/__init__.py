"""The LoRA kernels in Triton (shrink, expand, the per-batch metadata) and their dispatch: Triton on CUDA tensors, the PyTorch reference (kernels/cpu/reference.py) otherwise."""
