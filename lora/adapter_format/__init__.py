"""The PEFT LoRA adapter format, checked once for everyone: torch-free, so the control plane
(tenancy's uploads) runs exactly the checks the engine's loader runs (lora/loader.py).

One idea per module: `safetensors_header` (the header and the data region's tiling),
`peft_config` (adapter_config.json), `lora_tensors` (tensor names and the shape each needs on
the base model), `weights` (values: finite and within float16's range once scaled),
`adapter` (the sequence of all of them), `bundle` (the files as one canonical archive, the
unit the store hashes and ships) and `checkpoint` (the served model's shapes, from its
config.json). Errors are lora.errors' AdapterError subclasses: 400s naming the problem.

Nothing here imports torch, nor anything that does (tests/lora/test_adapter_format.py runs the
import in a fresh interpreter); tenancy imports this package and nothing else of lora.
"""

from lora.adapter_format.adapter import (
    AdapterLayout,
    check_adapter,
    check_layout,
    iter_lora_arrays,
)
from lora.adapter_format.bundle import (
    BUNDLE_CHUNK,
    BUNDLE_END,
    BUNDLE_FILES,
    bundle_padding,
    bundle_sha256,
    iter_bundle,
    make_bundle,
    member_header,
    read_bundle,
)
from lora.adapter_format.checkpoint import (
    CheckpointShape,
    parse_checkpoint_shape,
    read_checkpoint_shape,
)
from lora.adapter_format.lora_tensors import TensorPair, expected_shape, tensor_name
from lora.adapter_format.peft_config import CONFIG_FILE, PeftLoraConfig
from lora.adapter_format.safetensors_header import (
    WEIGHTS_FILE,
    BytesSource,
    FileSource,
    WeightsSource,
)
from lora.adapter_format.weights import MAX_WEIGHT_MAGNITUDE, LoraArrays
from lora.dims import LORA_MODULES, BaseModelDims
from lora.errors import AdapterError

__all__ = [
    "BUNDLE_CHUNK",
    "BUNDLE_END",
    "BUNDLE_FILES",
    "CONFIG_FILE",
    "LORA_MODULES",
    "MAX_WEIGHT_MAGNITUDE",
    "WEIGHTS_FILE",
    "AdapterError",
    "AdapterLayout",
    "BaseModelDims",
    "BytesSource",
    "CheckpointShape",
    "FileSource",
    "LoraArrays",
    "PeftLoraConfig",
    "TensorPair",
    "WeightsSource",
    "bundle_padding",
    "bundle_sha256",
    "check_adapter",
    "check_layout",
    "expected_shape",
    "iter_bundle",
    "iter_lora_arrays",
    "make_bundle",
    "member_header",
    "parse_checkpoint_shape",
    "read_bundle",
    "read_checkpoint_shape",
    "tensor_name",
]
