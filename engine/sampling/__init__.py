"""From a step's logits to its tokens: sampling parameters, the in-place logits edits, and the sampler."""
