"""PEFT LoRA adapters: loading and validation, the adapter cache tiers, batch metadata, layers."""
