"""Engine subcommands of the `loragate` console script: `make-model` and `engine`."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


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

    from engine.config import EngineConfig
    from engine.server import serve

    config = EngineConfig(
        model=args.model,
        served_model_name=args.served_model_name,
        dtype=args.dtype,
        device=args.device,
        seed=args.seed,
        block_size=args.block_size,
        num_kv_blocks=args.num_kv_blocks,
        kv_cache_memory_bytes=int(args.kv_cache_memory_gb * (1 << 30)),
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len,
        policy=args.scheduling_policy,
        aging_steps=args.aging_steps,
        enable_prefix_caching=not args.no_prefix_caching,
        max_queue_len=args.max_queue_len,
    )
    serve(config, host=args.host, port=args.port, admin_token=os.environ.get(args.admin_token_env))
    return 0
