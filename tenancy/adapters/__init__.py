"""Adapter uploads: archive and file checks, PEFT config and safetensors header checks, storage."""
