"""Gateway settings: the one pydantic-settings class, created by the app factory and passed down.

It extends the tenancy settings (same `LORAGATE_` environment prefix), so the whole process is
configured by one object. Validation refuses unsafe or inconsistent values with the field's name:
the tenancy validators already refuse empty, short or placeholder secrets (pepper, salt secret).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, ValidationInfo, field_validator, model_validator

from engine.settings import EngineSettings
from gateway.engines.routing.affinity import MAX_ENTRIES
from gateway.engines.routing.policy import LOAD_FACTOR, RoutingPolicy
from gateway.model_entries import ModelEntry, check_entries
from tenancy.adapters.base_model import base_model_spec
from tenancy.settings import TenancySettings, strong_secret

EngineMode = Literal["inprocess", "http"]
EngineKind = Literal["loragate", "vllm"]


class GatewaySettings(TenancySettings):
    # ---- the served model --------------------------------------------------------------------
    # A local Hugging Face checkpoint directory: the tokenizer and chat template always come from
    # here; the in-process engine also loads its weights from here.
    model: Path
    # The name clients use for the base model; None: the directory's name.
    served_model_name: str | None = None
    # A Jinja chat template file that replaces the checkpoint's (a model whose own template has
    # no tools section, or another tool-call format: render tools as Hermes <tool_call> JSON).
    chat_template: Path | None = None
    # More base models beside this one (LORAGATE_MODELS, a JSON list; gateway/model_entries.py):
    # each its own engine pool, tokenizer and adapters. Empty: the one model above.
    models: list[ModelEntry] = Field(default_factory=list)

    # ---- engines -----------------------------------------------------------------------------
    engine_mode: EngineMode = "inprocess"
    engine_urls: list[str] = Field(default_factory=list)
    engine_kind: EngineKind = "loragate"
    engine_admin_token: SecretStr | None = None
    engine_connect_timeout_s: float = Field(default=5.0, gt=0)
    # How often replica health and adapter residency (/v1/models tiers) are refreshed.
    engine_poll_interval_s: float = Field(default=2.0, gt=0)
    engine_max_connections: int = Field(default=256, ge=1)
    # Behind the Gateway API Inference Extension (engine_urls: the inference gateway): each
    # engine request names its tier's InferenceObjective, `<prefix><tier>`.
    engine_objective_prefix: str | None = Field(default=None, pattern=r"^[a-z0-9][-a-z0-9.]*$")
    # The in-process engine's options: the same as `loragate engine`'s flags (engine/settings.py),
    # as LORAGATE_ENGINE__MAX_LORAS, ... In HTTP mode only `max_model_len` (a cap on the
    # context the gateway plans for) and `block_size` (routing's prefix keys) are read.
    engine: EngineSettings = Field(default_factory=EngineSettings)
    engine_drain_timeout_s: float = Field(default=30.0, ge=0)
    # How long an engine has to end a request it was asked to abort (the client left, a stop
    # string, shutdown) before the gateway stops listening; the ledger counts what arrived.
    engine_abort_timeout_s: float = Field(default=5.0, gt=0)
    # Which replica an engine request goes to (HTTP mode; gateway/engines/routing/): where the
    # tenant's prefix was last served and its adapter is resident, within load_factor x the
    # mean load; or today's adapter residency, then fewest outstanding requests.
    engine_routing: RoutingPolicy = "cache_aware"
    engine_routing_load_factor: float = Field(default=LOAD_FACTOR, ge=1.0)
    engine_routing_max_prefixes: int = Field(default=MAX_ENTRIES, ge=1)

    # ---- requests ----------------------------------------------------------------------------
    max_body_bytes: int = Field(default=2 * 1024 * 1024, ge=1024)
    # max_tokens when a request sets none; None: whatever room the context leaves.
    default_max_tokens: int | None = Field(default=None, ge=1)
    max_stop_strings: int = Field(default=16, ge=1)
    max_stop_string_chars: int = Field(default=256, ge=1)
    max_prompts_per_request: int = Field(default=64, ge=1)
    # Structured outputs: JSON with no whitespace between tokens (compact), or whatever
    # whitespace the model writes (flexible; a model may then loop on spaces or newlines).
    json_whitespace: Literal["compact", "flexible"] = "compact"
    # Quota policies and adapter visibility are cached this long (admin changes apply within it).
    policy_cache_ttl_s: float = Field(default=2.0, gt=0, le=60)
    # A comment line is sent on a stream that has been silent this long (queueing).
    sse_keepalive_s: float = Field(default=15.0, gt=0)
    # On SIGTERM: requests in flight get this long to finish; then each stream ends with an
    # error event and [DONE], and every settlement and usage record is written before exit.
    shutdown_grace_s: float = Field(default=30.0, ge=0)

    # ---- the HTTP server (a reverse proxy in front should add its own limits: docs/operations.md)
    # Host headers accepted; ["*"]: any. Behind a proxy, the names clients use.
    trusted_hosts: list[str] = Field(default_factory=lambda: ["*"])
    # Peers trusted to set X-Forwarded-For/-Proto (the proxies in front). By default none: a
    # client never chooses the address the audit log records.
    forwarded_allow_ips: list[str] = Field(default_factory=list)
    # A client must send its request head within header_timeout_s and its body within
    # body_timeout_s; an idle keep-alive connection closes after keepalive_timeout_s.
    header_timeout_s: float = Field(default=10.0, gt=0)
    body_timeout_s: float = Field(default=30.0, gt=0)
    keepalive_timeout_s: int = Field(default=5, ge=1)
    # Connections one client address may hold open at once (slow clients cannot take them all).
    max_connections_per_client: int = Field(default=256, ge=1)
    # A request head (request line and headers) larger than this gets a 431.
    max_header_bytes: int = Field(default=32 * 1024, ge=4096)
    # The HTTP parser and event loop uvicorn serves with; the limits above hold with either
    # (gateway/server/guard.py). httptools on uvloop served 1.23x the requests of h11 on asyncio
    # per worker (bench/gateway_overhead.py --stacks, full configuration, bench/RESULTS.md).
    http_parser: Literal["h11", "httptools"] = "httptools"
    event_loop: Literal["asyncio", "uvloop"] = "uvloop"

    # ---- usage ledger, metrics, start-up -----------------------------------------------------
    usage_flush_interval_s: float = Field(default=0.5, gt=0)
    usage_batch_size: int = Field(default=256, ge=1)
    usage_max_pending: int = Field(default=100_000, ge=1)
    max_metric_tenants: int = Field(default=500, ge=1)
    max_metric_models: int = Field(default=100, ge=1)  # per tenant
    metrics_token: SecretStr | None = None
    # OpenTelemetry: the OTLP/HTTP traces endpoint (a collector's http://host:4318/v1/traces)
    # request spans are exported to; unset, tracing is off (gateway/telemetry/tracing.py).
    otel_endpoint: str | None = None
    # Upgrade the database schema to head at start-up (the embedded default and the demo).
    auto_migrate: bool = False

    # ---- dashboard, API docs and dashboard SSO ------------------------------------------------
    # /openapi.json and /docs; false: both are 404.
    api_docs_enabled: bool = True
    # The web dashboard at /dashboard (admin and tenant-admin keys, or SSO); false: 404.
    dashboard_enabled: bool = True
    # A dashboard session (a signed cookie) lasts this long from login; then log in again.
    dashboard_session_ttl_s: float = Field(default=8 * 3600.0, gt=0, le=7 * 86400)
    # Signs dashboard sessions. Unset: derived from key_pepper (an HMAC under a fixed label),
    # which every replica already shares, so a session works on any replica with no secret to
    # distribute; set it (same rules as the pepper) to end every session without new keys.
    dashboard_session_secret: SecretStr | None = None
    # "Sign in with SSO" on the dashboard (authorization code + PKCE at oidc_issuer): the
    # dashboard's client id there, and its secret when the provider makes it a confidential one.
    oidc_client_id: str | None = None
    oidc_client_secret: SecretStr | None = None
    # The callback URL registered at the provider for that client (…/dashboard/sso/callback);
    # configured, never built from a request's Host header.
    oidc_redirect_url: str | None = None

    @field_validator("engine_urls")
    @classmethod
    def _urls(cls, urls: list[str]) -> list[str]:
        for url in urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError("engine_urls must be http:// or https:// URLs")
        return [url.rstrip("/") for url in urls]

    @field_validator("otel_endpoint")
    @classmethod
    def _otel_endpoint(cls, url: str | None) -> str | None:
        if not url:  # set but empty: off, as unset
            return None
        if not url.startswith(("http://", "https://")):
            raise ValueError("otel_endpoint must be an http:// or https:// URL (OTLP/HTTP)")
        return url

    @field_validator("dashboard_session_secret")
    @classmethod
    def _session_secret(cls, value: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
        return None if value is None else strong_secret(value, info.field_name or "secret")

    @model_validator(mode="after")
    def _gateway_checks(self) -> GatewaySettings:
        if self.oidc_client_id and not (self.oidc_issuer and self.oidc_redirect_url):
            raise ValueError("oidc_client_id needs oidc_issuer and oidc_redirect_url")
        session = self.dashboard_session_secret
        if session is not None and session.get_secret_value() in (
            self.key_pepper.get_secret_value(),
            self.salt_secret.get_secret_value(),
        ):
            raise ValueError("dashboard_session_secret must differ from the other secrets")
        if self.engine_mode == "http" and not self.engine_urls:
            raise ValueError("engine_mode 'http' needs engine_urls")
        if self.engine_mode == "inprocess" and self.engine_kind != "loragate":
            raise ValueError("engine_kind 'vllm' needs engine_mode 'http'")
        if (
            not (self.model / "tokenizer_config.json").is_file()
            and not (self.model / "tokenizer.json").is_file()
        ):
            raise ValueError("model must be a checkpoint directory with a tokenizer")
        if self.chat_template is not None and not self.chat_template.is_file():
            raise ValueError("chat_template must be a file (a Jinja chat template)")
        # Field by field: setting one nested value (LORAGATE_ADAPTER_LIMITS__MAX_FILES) must not
        # drop the others' derivation.
        if "max_rank" not in self.adapter_limits.model_fields_set:
            # Uploads the engine would refuse are refused at upload time.
            self.adapter_limits.max_rank = min(
                self.adapter_limits.max_rank, self.engine.max_lora_rank
            )
        # Uploaded adapters are checked against the model actually served; what the operator
        # set explicitly wins.
        chosen = {f: getattr(self.base_model, f) for f in self.base_model.model_fields_set}
        self.base_model = base_model_spec(self.model, self.model_name).model_copy(update=chosen)
        check_entries(self)
        return self

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model.resolve().name

    def engine_for(self, entry: ModelEntry) -> EngineSettings:
        """A `models` entry's engine options: these with the entry's over them. Adapters
        served from the start (`lora_modules`) belong to the primary model: never carried."""
        base = self.engine.model_dump(exclude={"lora_modules"}, exclude_unset=True)
        cache = self.engine.adapter_cache_dir
        if cache and "adapter_cache_dir" not in entry.engine:
            # Its own disk cache beside the primary's: two caches' evictions in one directory
            # would delete each other's adapters.
            safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in entry.name)
            base["adapter_cache_dir"] = f"{cache.rstrip('/')}-{safe}"
        return EngineSettings.model_validate({**base, **entry.engine})
