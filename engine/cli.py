"""Engine subcommands of the `loragate` console script: `make-model` and `engine`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from engine.config import EngineConfig, LoraModule


def parse_lora_modules(values: list[str]) -> tuple[LoraModule, ...]:
    """Each value: `name=path`, a JSON object {"name", "path", "base_model_name"?} or a JSON
    list of such objects. Raises ValueError naming the bad value."""
    modules: list[LoraModule] = []
    for value in values:
        text = value.strip()
        if not text.startswith(("{", "[")):
            name, sep, path = text.partition("=")
            if not sep or not name or not path:
                raise ValueError(f"--lora-modules expects name=path or JSON, got {value[:200]!r}")
            modules.append(LoraModule(name=name, path=path))
            continue
        try:
            parsed = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise ValueError(f"--lora-modules: invalid JSON {value[:200]!r}") from exc
        for item in parsed if isinstance(parsed, list) else [parsed]:
            modules.append(_lora_module(item))
    names = [m.name for m in modules]
    if len(set(names)) != len(names):
        raise ValueError("--lora-modules names an adapter twice")
    return tuple(modules)


def _lora_module(item: Any) -> LoraModule:
    if not isinstance(item, dict) or not set(item) <= {"name", "path", "base_model_name"}:
        raise ValueError('--lora-modules JSON items are {"name", "path", "base_model_name"?}')
    name, path, base = item.get("name"), item.get("path"), item.get("base_model_name")
    if not isinstance(name, str) or not isinstance(path, str) or not name or not path:
        raise ValueError("--lora-modules: name and path must be non-empty strings")
    if base is not None and not isinstance(base, str):
        raise ValueError("--lora-modules: base_model_name must be a string")
    return LoraModule(name=name, path=path, base_model_name=base)


def add_subcommands(subparsers: Any) -> None:
    make = subparsers.add_parser(
        "make-model", help="write a deterministic tiny/small Hugging Face checkpoint directory"
    )
    make.add_argument("out", type=Path)
    make.add_argument("--size", choices=["tiny", "small"], default="tiny")
    make.add_argument("--family", choices=["llama", "qwen2", "qwen3"], default="llama")
    make.add_argument("--tie-embeddings", action="store_true", help="tie lm_head to the embedding")
    make.set_defaults(handler=_make_model)

    serve = subparsers.add_parser("engine", help="serve the tokens-only engine over HTTP")
    serve.add_argument("--model", required=True, help="a local Hugging Face checkpoint directory")
    serve.add_argument("--served-model-name", default=None)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8100)
    serve.add_argument(
        "--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"]
    )
    serve.add_argument("--device", default="cpu")
    serve.add_argument("--block-size", type=int, default=16)
    serve.add_argument(
        "--decode-attention",
        default="auto",
        choices=["auto", "matmul", "sdpa"],
        help="decode attention backend; auto times both at start-up (CPU)",
    )
    serve.add_argument("--num-kv-blocks", type=int, default=None)
    serve.add_argument("--kv-cache-memory-gb", type=float, default=1.0)
    serve.add_argument("--max-num-seqs", type=int, default=64)
    serve.add_argument("--max-num-batched-tokens", type=int, default=2048)
    serve.add_argument("--max-model-len", type=int, default=None)
    serve.add_argument("--scheduling-policy", choices=["priority", "fcfs"], default="priority")
    serve.add_argument("--aging-steps", type=int, default=64)
    serve.add_argument("--no-prefix-caching", action="store_true")
    serve.add_argument("--max-queue-len", type=int, default=4096)
    serve.add_argument("--seed", type=int, default=0)
    serve.add_argument(
        "--lora-modules",
        nargs="+",
        default=[],
        metavar="MODULE",
        help='adapters to serve from the start: name=path, a JSON object {"name", "path", '
        '"base_model_name"} or a JSON list of them',
    )
    serve.add_argument("--disable-lora", action="store_true", help="no LoRA wrappers or slots")
    serve.add_argument("--max-loras", type=int, default=4, help="adapter slots on the device")
    serve.add_argument(
        "--max-cpu-loras",
        type=int,
        default=None,
        help="adapters cached in CPU memory (>= max-loras)",
    )
    serve.add_argument("--max-lora-rank", type=int, default=16)
    serve.add_argument(
        "--admin-token-env",
        default="LORAGATE_ENGINE_ADMIN_TOKEN",
        help="environment variable holding the admin token for adapter endpoints",
    )
    serve.set_defaults(handler=_serve)


def _make_model(args: argparse.Namespace) -> int:
    from engine.make_model import make_model

    path = make_model(
        args.out, size=args.size, family=args.family, tie_word_embeddings=args.tie_embeddings
    )
    print(f"wrote {args.size} {args.family} checkpoint to {path}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    import os

    from engine.server import serve
    from lora.errors import AdapterError

    try:
        config = _engine_config(args)
    except ValueError as exc:
        raise SystemExit(f"loragate engine: {exc}") from exc
    try:
        serve(
            config, host=args.host, port=args.port, admin_token=os.environ.get(args.admin_token_env)
        )
    except AdapterError as exc:  # a --lora-modules adapter failed validation at start-up
        raise SystemExit(f"loragate engine: --lora-modules: {exc.message}") from exc
    return 0


def _engine_config(args: argparse.Namespace) -> EngineConfig:
    """Raises ValueError naming the bad flag (max-cpu-loras below max-loras, ...)."""
    return EngineConfig(
        model=args.model,
        served_model_name=args.served_model_name,
        dtype=args.dtype,
        device=args.device,
        seed=args.seed,
        block_size=args.block_size,
        decode_attention=args.decode_attention,
        num_kv_blocks=args.num_kv_blocks,
        kv_cache_memory_bytes=int(args.kv_cache_memory_gb * (1 << 30)),
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len,
        policy=args.scheduling_policy,
        aging_steps=args.aging_steps,
        enable_prefix_caching=not args.no_prefix_caching,
        max_queue_len=args.max_queue_len,
        enable_lora=not args.disable_lora,
        max_loras=args.max_loras,
        max_cpu_loras=args.max_cpu_loras,
        max_lora_rank=args.max_lora_rank,
        lora_modules=parse_lora_modules(args.lora_modules),
    )
