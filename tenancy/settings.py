"""Tenancy settings: one pydantic-settings class, built once by the app factory and passed down.

Validators refuse unsafe defaults: secrets must be long, not placeholders, and distinct.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from tenancy.alerts.settings import AlertSettings
from tenancy.spend.schemas import PriceSpec

_PLACEHOLDERS = {"changeme", "changethis", "secret", "password", "pepper", "test"}
_MIN_SECRET_LEN = 32


def strong_secret(value: SecretStr, name: str) -> SecretStr:
    """The rule for every server secret: long, not a placeholder; the error names the field."""
    raw = value.get_secret_value()
    if len(raw) < _MIN_SECRET_LEN:
        raise ValueError(f"{name} must be at least {_MIN_SECRET_LEN} characters")
    if raw.lower() in _PLACEHOLDERS or len(set(raw)) < 8:
        raise ValueError(f"{name} looks like a placeholder; generate a random one")
    return value


class TierBand(BaseModel):
    """A tier: a band of engine priorities (lower runs earlier; a request hint is clamped into
    it), and the most KV cache one request may claim.

    `max_request_kv_tokens` bounds n x (prompt tokens + max_tokens), summed over a request's
    prompts: what its sequences can hold in an engine's KV cache at once. Quotas bound tokens
    over time, not one request's footprint, so without it a single n=64, max_tokens=2000 request
    from a tenant without quotas fills an engine's cache for minutes. The default is a fraction
    of one engine's cache on a data-centre GPU and above a whole 32k context.
    """

    lo: int
    hi: int
    default: int
    max_request_kv_tokens: int = Field(default=65_536, gt=0)

    @model_validator(mode="after")
    def _check(self) -> TierBand:
        if not self.lo <= self.default <= self.hi:
            raise ValueError("tier band needs lo <= default <= hi")
        return self


def _default_tiers() -> dict[str, TierBand]:
    return {
        "realtime": TierBand(lo=0, hi=9, default=0),
        "standard": TierBand(lo=10, hi=19, default=10),
        "batch": TierBand(lo=20, hi=29, default=20),
    }


class BaseModelSpec(BaseModel):
    """The served base model's dimensions, against which uploaded adapter shapes are checked."""

    name: str = "loragate/tiny"
    hidden_size: int = Field(default=64, gt=0)
    intermediate_size: int = Field(default=128, gt=0)
    num_hidden_layers: int = Field(default=2, gt=0)
    num_attention_heads: int = Field(default=4, gt=0)
    num_key_value_heads: int = Field(default=2, gt=0)
    head_dim: int | None = None

    @property
    def resolved_head_dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads


class AdapterLimits(BaseModel):
    max_rank: int = Field(default=64, gt=0)
    max_upload_bytes: int = Field(default=256 * 1024 * 1024, gt=0)
    max_files: int = Field(default=8, gt=0)
    max_compression_ratio: float = Field(default=100.0, gt=1.0)
    max_safetensors_header_bytes: int = Field(default=1024 * 1024, gt=0)
    max_name_length: int = Field(default=64, gt=0)


class TenancySettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LORAGATE_", env_nested_delimiter="__")

    database_url: str = "sqlite+aiosqlite:///./data/loragate.db"
    redis_url: str | None = None
    # redis_url names one node of a Redis Cluster; the client finds the others.
    redis_cluster: bool = False
    redis_key_prefix: str = "lg:"
    quota_store: Literal["inprocess", "redis"] = "inprocess"
    # Concurrency leases expire so a crashed request cannot hold a slot forever.
    lease_ttl_s: float = Field(default=600.0, gt=0)

    key_pepper: SecretStr
    salt_secret: SecretStr
    key_prefix: str = "lg"
    # Revocation must reach every replica within 2 s even without Redis, so the TTL is capped.
    key_cache_ttl_s: float = Field(default=1.0, gt=0, le=2.0)
    key_revocation_channel: str = "loragate:keys:revoked"
    default_rotation_grace_s: float = Field(default=3600.0, ge=0)

    tiers: dict[str, TierBand] = Field(default_factory=_default_tiers)
    default_tier: str = "standard"
    vllm_priority_offset: int = 0

    # Where uploaded adapters' bytes live (tenancy/adapters/store.py): the database, which every
    # gateway replica reaches (no shared volume), or files under adapter_store_dir.
    adapter_store: Literal["database", "directory"] = "database"
    adapter_store_dir: Path = Path("./data/adapters")
    adapter_limits: AdapterLimits = Field(default_factory=AdapterLimits)
    base_model: BaseModelSpec = Field(default_factory=BaseModelSpec)

    # Display only: amounts are stored in micro-units (1e-6) of this currency.
    currency: str = Field(default="USD", pattern=r"^[A-Z]{3}$")
    # Default prices per served model name; a price set through the admin API wins over these.
    prices: dict[str, PriceSpec] = Field(default_factory=dict)

    oidc_issuer: str | None = None
    oidc_audience: str | None = None
    oidc_jwks_url: str | None = None
    oidc_algorithms: list[str] = Field(default_factory=lambda: ["RS256", "ES256"])
    oidc_role_claim: str = "roles"
    oidc_admin_role: str = "loragate-admin"
    oidc_tenant_admin_role: str = "loragate-tenant-admin"
    oidc_tenant_claim: str = "loragate_tenant"
    oidc_jwks_ttl_s: float = Field(default=300.0, gt=0)

    # Budget alerts and their webhooks (tenancy/alerts/).
    alerts: AlertSettings = Field(default_factory=AlertSettings)

    @field_validator("key_pepper", "salt_secret")
    @classmethod
    def _strong_secret(cls, value: SecretStr, info: object) -> SecretStr:
        return strong_secret(value, getattr(info, "field_name", "secret"))

    @field_validator("key_prefix")
    @classmethod
    def _prefix_shape(cls, value: str) -> str:
        if not value.isalnum() or not value.islower() or len(value) > 8:
            raise ValueError("key_prefix must be 1-8 lowercase alphanumerics")
        return value

    @model_validator(mode="after")
    def _cross_checks(self) -> TenancySettings:
        if self.key_pepper.get_secret_value() == self.salt_secret.get_secret_value():
            raise ValueError("key_pepper and salt_secret must differ")
        if self.default_tier not in self.tiers:
            raise ValueError("default_tier must name one of tiers")
        if self.quota_store == "redis" and not self.redis_url:
            raise ValueError("quota_store 'redis' needs redis_url")
        if self.oidc_issuer and not (self.oidc_audience and self.oidc_jwks_url):
            raise ValueError("oidc_issuer needs oidc_audience and oidc_jwks_url")
        if "none" in {a.lower() for a in self.oidc_algorithms} or any(
            a.upper().startswith("HS") for a in self.oidc_algorithms
        ):
            raise ValueError("oidc_algorithms must be asymmetric (no 'none', no HS*)")
        return self
