"""One forward pass per step: the model runner, its flat inputs, and the attention and matmul backends it picks at start-up (PyTorch, torch.compile, the native CPU decoder)."""
