"""Engine subcommands of the `loragate` console script: `make-model`, `make-adapter` and `engine`."""

from __future__ import annotations

import argparse
import json
import logging
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from engine.config import EngineConfig, LoraModule
from engine.settings import EngineSettings
from lora.dims import LORA_MODULES


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

    adapter = subparsers.add_parser(
        "make-adapter",
        help="write a PEFT LoRA adapter with seeded random weights for a checkpoint's shapes",
    )
    adapter.add_argument("model_dir", type=Path, metavar="MODEL_DIR", help="the base checkpoint")
    adapter.add_argument("out", type=Path, metavar="OUT_DIR")
    adapter.add_argument("--rank", type=int, required=True)
    adapter.add_argument("--seed", type=int, default=0)
    adapter.add_argument("--alpha", type=float, default=None, help="lora_alpha (default: 2 x rank)")
    adapter.add_argument("--target-modules", nargs="+", choices=LORA_MODULES,
                         default=list(LORA_MODULES), metavar="MODULE",
                         help=f"some of {', '.join(LORA_MODULES)} (default: all)")  # fmt: skip
    adapter.add_argument("--base-model-name", default=None,
                         help="base_model_name_or_path (default: MODEL_DIR's name; an upload "
                         "needs the name the gateway serves the model under)")  # fmt: skip
    adapter.set_defaults(handler=_make_adapter)

    serve = subparsers.add_parser("engine", help="serve the tokens-only engine over HTTP")
    serve.add_argument("--model", required=True, help="a local Hugging Face checkpoint directory")
    serve.add_argument("--served-model-name", default=None)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8100)
    add_engine_flags(serve)
    serve.add_argument(
        "--admin-token-env",
        default="LORAGATE_ENGINE_ADMIN_TOKEN",
        help="environment variable holding the admin token for adapter endpoints",
    )
    serve.add_argument(
        "--adapter-source",
        default=None,
        metavar="URL",
        help="the gateway (any replica, or the Service in front) adapters named by hash are "
        "fetched from, with the admin token (default: $LORAGATE_ADAPTER_SOURCE; unset: "
        "adapters load from lora_path only)",
    )
    serve.add_argument(
        "--otel-endpoint",
        default=None,
        help="OTLP/HTTP traces endpoint (a collector's http://HOST:4318/v1/traces) to send "
        "request spans to (default: $LORAGATE_OTEL_ENDPOINT, the gateway's; unset: no tracing)",
    )
    serve.set_defaults(handler=_serve)


def _make_model(args: argparse.Namespace) -> int:
    from engine.make_model import make_model

    path = make_model(
        args.out, size=args.size, family=args.family, tie_word_embeddings=args.tie_embeddings
    )
    print(f"wrote {args.size} {args.family} checkpoint to {path}")
    return 0


def _make_adapter(args: argparse.Namespace) -> int:
    from lora.make_adapter import AdapterRecipe, make_adapter

    try:
        recipe = AdapterRecipe(
            rank=args.rank, seed=args.seed, alpha=args.alpha,
            target_modules=tuple(args.target_modules), base_model_name=args.base_model_name,
        )  # fmt: skip
        path = make_adapter(args.model_dir, args.out, recipe)
    except ValueError as exc:  # a bad option, or MODEL_DIR without a usable config.json
        raise SystemExit(f"loragate make-adapter: {exc}") from None
    print(f"wrote a rank-{args.rank} adapter for {args.model_dir} to {path}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    import os

    from engine.server import serve
    from lora.errors import AdapterError

    try:
        config = _engine_config(args)
    except ValueError as exc:
        raise SystemExit(f"loragate engine: {exc}") from exc
    log_startup_choices()
    try:
        serve(
            config,
            host=args.host,
            port=args.port,
            admin_token=os.environ.get(args.admin_token_env),
            otel_endpoint=args.otel_endpoint or os.environ.get("LORAGATE_OTEL_ENDPOINT"),
            adapter_source=args.adapter_source or os.environ.get("LORAGATE_ADAPTER_SOURCE"),
        )
    except AdapterError as exc:  # a --lora-modules adapter failed validation at start-up
        raise SystemExit(f"loragate engine: --lora-modules: {exc.message}") from exc
    return 0


def log_startup_choices() -> None:
    """Show the engine's start-up choices (native kernels or oneDNN, attention backends,
    packed weights: engine/step/native_matmul.py and its neighbours log them at INFO, once each) on
    stderr: which paths this machine got decides its speed, and an operator, or a benchmark
    reading the server's log, can see them. Per-request logging stays uvicorn's."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s:     %(name)s: %(message)s"))
    for name in ("engine", "kernels", "lora"):
        logger = logging.getLogger(name)
        if not logger.handlers:
            logger.addHandler(handler)
            logger.setLevel(logging.INFO)


def _engine_config(args: argparse.Namespace) -> EngineConfig:
    """Raises ValueError naming the bad flag (max-cpu-loras below max-loras, ...)."""
    values = {name: getattr(args, name) for name in EngineSettings.model_fields}
    values["lora_modules"] = [
        {"name": m.name, "path": m.path, "base_model_name": m.base_model_name}
        for m in parse_lora_modules(args.lora_modules)
    ]
    try:
        settings = EngineSettings(**values)
    except ValidationError as exc:
        first = exc.errors()[0]
        if not first["loc"]:  # a rule across options: EngineConfig's message names them
            raise ValueError(first["msg"].removeprefix("Value error, ")) from None
        flag = "--" + str(first["loc"][0]).replace("_", "-")
        raise ValueError(f"{flag}: {first['msg']}") from None
    return settings.to_engine_config(model=args.model, served_model_name=args.served_model_name)


# Earlier spellings of two boolean flags, kept so existing scripts keep working.
_ALIASES = {"enable_prefix_caching": "--no-prefix-caching", "enable_lora": "--disable-lora"}


def add_engine_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per `EngineSettings` field: the gateway's embedded engine and this CLI take the
    same options by construction (a test compares the two sets)."""
    for name, field in EngineSettings.model_fields.items():
        flag = "--" + name.replace("_", "-")
        kind = _kind(field.annotation)
        if name == "lora_modules":
            parser.add_argument(
                flag, nargs="+", default=[], metavar="MODULE",
                help='adapters to serve from the start: name=path, a JSON object {"name", '
                '"path", "base_model_name"} or a JSON list of them',
            )  # fmt: skip
        elif kind is bool:
            parser.add_argument(
                flag, action=argparse.BooleanOptionalAction, default=field.default,
                help=field.description,
            )  # fmt: skip
            if name in _ALIASES:
                parser.add_argument(
                    _ALIASES[name], dest=name, action="store_false", help=f"same as --no-{flag[2:]}"
                )
        elif isinstance(kind, tuple):  # a Literal: its values are the choices
            parser.add_argument(flag, choices=kind, default=field.default, help=field.description)
        else:
            parser.add_argument(flag, type=kind, default=field.default, help=field.description)


def _kind(annotation: Any) -> Any:
    """bool, int, float or str (of `X | None` too), or the tuple of a Literal's values."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    if typing.get_origin(annotation) is typing.Literal:
        return typing.get_args(annotation)
    return annotation
