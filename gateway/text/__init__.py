"""Text on the gateway side of the engine: the tokenizer and chat template, incremental
detokenization, stop strings, and one choice's state as its tokens arrive."""
