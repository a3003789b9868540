"""Adapter uploads: archive and file checks, the LoRA loader's own format checks
(lora/adapter_format, torch-free) against the served base model, storage."""
