"""Examples for the admin API's OpenAPI document: one request body and one answer per route.

They are data, not code paths: `gateway/api_docs/openapi.py` puts them on the operations, and
`tests/gateway/api_docs/test_openapi.py` checks that every admin route has one and that each example is
valid against the route's own schema, so an example cannot drift from what the route accepts.
Ids and keys here are made up (a key's shape, never a real key).
"""

from __future__ import annotations

from typing import Any

TENANT_ID = "3f1c6f0e-6d7b-4a53-9a53-0c1d2e3f4a5b"
KEY_ID = "8a2b7c1d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"
ADAPTER_ID = "5d4c3b2a-1f0e-4d9c-8b7a-6f5e4d3c2b1a"
WHEN = "2025-01-15T09:30:00Z"

TENANT = {
    "id": TENANT_ID, "name": "acme", "tier": "standard", "status": "active", "salt_epoch": 0,
    "created_at": WHEN, "updated_at": WHEN, "metrics_label": "t_5e1f0c9b7a2d",
}  # fmt: skip
KEY = {
    "id": KEY_ID, "tenant_id": TENANT_ID, "name": "ci-runner", "prefix": "lg", "last_four": "Zq7k",
    "scopes": ["inference"], "expires_at": None, "revoked_at": None,
    "rotation_grace_until": None, "replaced_by_id": None, "created_at": WHEN,
}  # fmt: skip
# The shape of a key, not a key: the checksum does not match.
KEY_CREATED = {**KEY, "key": "lg_EXAMPLEexampleEXAMPLEexampleEXAMPLEexample0Zq7k"}
LIMITS = {
    "requests_per_minute": 600, "tokens_per_minute": 200000, "max_concurrent": 16,
    "daily_token_budget": 5000000, "monthly_token_budget": None,
    "daily_spend_budget_micros": 25000000, "monthly_spend_budget_micros": None,
}  # fmt: skip
POLICY = {**LIMITS, "tenant_id": TENANT_ID, "api_key_id": None, "model": None}
ADAPTER = {
    "id": ADAPTER_ID, "owner_tenant_id": TENANT_ID, "name": "support-bot", "version": 2,
    "base_model": "tiny", "rank": 8, "alpha": 16.0, "target_modules": ["q_proj", "v_proj"],
    "sha256": "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
    "size_bytes": 131072, "status": "ready", "created_at": WHEN,
}  # fmt: skip
CANARY_ID = "6e5d4c3b-2a1f-4e0d-9c8b-7a6f5e4d3c2b"
ALIAS = {
    "owner_tenant_id": TENANT_ID, "name": "support-bot", "version": 2, "version_id": ADAPTER_ID,
    "canary_version": None, "canary_version_id": None, "canary_weight": 0, "updated_at": WHEN,
}  # fmt: skip
CANARY = {**ALIAS, "canary_version": 3, "canary_version_id": CANARY_ID, "canary_weight": 10}
PUBLIC_ALIAS = {**ALIAS, "owner_tenant_id": None, "name": "sql-helper"}
USAGE = [
    {"tenant_id": TENANT_ID, "day": "2025-01-15", "model": "tiny", "num_requests": 120,
     "prompt_tokens": 48000, "completion_tokens": 12000, "cached_tokens": 9000},
    {"tenant_id": TENANT_ID, "day": "2025-01-15", "model": "support-bot", "num_requests": 30,
     "prompt_tokens": 9000, "completion_tokens": 4000, "cached_tokens": 0},
]  # fmt: skip
AUDIT = [{
    "id": "0b1c2d3e-4f5a-4b6c-8d7e-9f0a1b2c3d4e", "actor": f"key:{KEY_ID}", "actor_name": "ops",
    "actor_tenant_id": TENANT_ID, "tenant_id": TENANT_ID, "action": "key.create",
    "object_type": "api_key", "object_id": KEY_ID, "before": None,
    "after": {"name": "ci-runner", "scopes": ["inference"]}, "request_id": "req_0123abcd",
    "client_addr": "203.0.113.7", "created_at": WHEN,
}]  # fmt: skip
QUOTA_STATE_EXAMPLE = {
    "tenant_id": TENANT_ID,
    "api_key_id": None,
    "subject": f"t:{TENANT_ID}",
    "has_own_policy": True,
    "as_of": WHEN,
    "limits": [
        {"name": "requests_per_minute", "limit": 600, "used": 42, "remaining": 558,
         "resets_in_s": 17.5, "resets_at": "2025-01-15T09:30:17.500000Z"},
        {"name": "tokens_per_minute", "limit": 200000, "used": 18432, "remaining": 181568,
         "resets_in_s": 17.5, "resets_at": "2025-01-15T09:30:17.500000Z"},
        {"name": "max_concurrent", "limit": 16, "used": 3, "remaining": 13,
         "resets_in_s": None, "resets_at": None},
        {"name": "daily_token_budget", "limit": 5000000, "used": 731220, "remaining": 4268780,
         "resets_in_s": 52200.0, "resets_at": "2025-01-16T00:00:00Z"},
        {"name": "monthly_token_budget", "limit": None, "used": 9120400, "remaining": None,
         "resets_in_s": 1434600.0, "resets_at": "2025-02-01T00:00:00Z"},
        {"name": "daily_spend_budget_micros", "limit": 25000000, "used": 3120450,
         "remaining": 21879550, "resets_in_s": 52200.0, "resets_at": "2025-01-16T00:00:00Z"},
        {"name": "monthly_spend_budget_micros", "limit": None, "used": 40210775,
         "remaining": None, "resets_in_s": 1434600.0, "resets_at": "2025-02-01T00:00:00Z"},
    ],
    "rejections_last_hour": {"rate_limit_exceeded": 4, "model_not_found": 1},
}  # fmt: skip

PRICE = {
    "model": "tiny", "adapter_id": None, "currency": "USD", "prompt": "0.150000",
    "cached": "0.075000", "completion": "0.600000", "prompt_micros_per_mtok": 150000,
    "cached_micros_per_mtok": 75000, "completion_micros_per_mtok": 600000, "source": "database",
    "updated_at": WHEN,
}  # fmt: skip
SPEND_TOKENS = {"num_requests": 150, "prompt_tokens": 57000, "cached_tokens": 9000,
                "completion_tokens": 16000}  # fmt: skip
SPEND = {
    "tenant_id": TENANT_ID, "currency": "USD", "since": "2025-01-01", "until": None,
    "total": {**SPEND_TOKENS, "tenant_id": TENANT_ID, "api_key_id": None, "model": None,
              "adapter_id": None, "cost_micros": 17475, "cost": "0.017475"},
    "by_key": [{**SPEND_TOKENS, "tenant_id": None, "api_key_id": KEY_ID, "model": None,
                "adapter_id": None, "cost_micros": 17475, "cost": "0.017475"}],
    "by_model": [{**SPEND_TOKENS, "tenant_id": None, "api_key_id": None, "model": "tiny",
                  "adapter_id": None, "cost_micros": 17475, "cost": "0.017475"}],
}  # fmt: skip

WEBHOOK_ID = "7e6d5c4b-3a29-4187-9f6e-5d4c3b2a1908"
EVENT_ID = "2c3d4e5f-6a7b-4c8d-9e0f-1a2b3c4d5e6f"
WEBHOOK = {
    "id": WEBHOOK_ID, "tenant_id": TENANT_ID, "url": "https://hooks.example.com/loragate",
    "thresholds": [50, 80, 100], "events": ["budget.threshold", "outage.quota_store"],
    "enabled": True, "created_at": WHEN, "updated_at": WHEN,
}  # fmt: skip
# The shape of a signing secret, not one.
WEBHOOK_CREATED = {**WEBHOOK, "secret": "whsec_EXAMPLEexampleEXAMPLEexampleEXAMPLEexample0"}
DELIVERY = {
    "id": EVENT_ID, "event_type": "budget.threshold", "status": "delivered", "num_attempts": 2,
    "last_status_code": 200, "created_at": WHEN, "delivered_at": "2025-01-15T09:30:10Z",
    "next_attempt_at": None,
    "payload": {"id": EVENT_ID, "type": "budget.threshold", "created_at": WHEN,
                "tenant_id": TENANT_ID, "subject": f"t:{TENANT_ID}", "api_key_id": None,
                "budget": "daily_token_budget", "unit": "tokens", "period": "2025-01-15",
                "threshold": 80, "used": 4000120, "limit": 5000000, "exhausted": False},
    "attempts": [
        {"attempt": 1, "status_code": 500, "error": "HTTP 500", "started_at": WHEN,
         "finished_at": "2025-01-15T09:30:00.120000Z"},
        {"attempt": 2, "status_code": 200, "error": None, "started_at": "2025-01-15T09:30:10Z",
         "finished_at": "2025-01-15T09:30:10.080000Z"},
    ],
}  # fmt: skip

T = "/admin/v1/tenants/{tenant_id}"
K = T + "/keys/{key_id}"
W = T + "/webhook"
A = T + "/adapter-aliases/{name}"
P = "/admin/v1/adapter-aliases/{name}"

# (method, path) -> {"request": body example (JSON routes only), "response": answer example}
ADMIN_EXAMPLES: dict[tuple[str, str], dict[str, Any]] = {
    ("post", "/admin/v1/tenants"): {"request": {"name": "acme", "tier": "standard"},
                                    "response": TENANT},
    ("get", "/admin/v1/tenants"): {"response": [TENANT]},
    ("get", T): {"response": TENANT},
    ("patch", T): {"request": {"status": "suspended"}, "response": {**TENANT, "status": "suspended"}},
    ("delete", T): {},
    ("post", T + "/salt/rotate"): {"response": {**TENANT, "salt_epoch": 1}},
    ("post", T + "/keys"): {
        "request": {"name": "ci-runner", "scopes": ["inference"], "expires_at": None},
        "response": KEY_CREATED,
    },
    ("get", T + "/keys"): {"response": [KEY]},
    ("post", K + "/rotate"): {"request": {"grace_seconds": 3600}, "response": KEY_CREATED},
    ("post", K + "/revoke"): {"response": {**KEY, "revoked_at": WHEN}},
    ("get", T + "/quotas"): {"response": POLICY},
    ("put", T + "/quotas"): {"request": LIMITS, "response": POLICY},
    ("get", K + "/quotas"): {"response": {**POLICY, "api_key_id": KEY_ID}},
    ("put", K + "/quotas"): {
        "request": {**LIMITS, "requests_per_minute": 60},
        "response": {**POLICY, "requests_per_minute": 60, "api_key_id": KEY_ID},
    },
    ("get", T + "/quota-policies"): {"response": [
        POLICY, {**POLICY, "requests_per_minute": 60, "model": "small"},
        {**POLICY, "requests_per_minute": 30, "api_key_id": KEY_ID, "model": "small"},
    ]},
    ("get", T + "/quota-state"): {"response": QUOTA_STATE_EXAMPLE},
    ("get", K + "/quota-state"): {
        "response": {**QUOTA_STATE_EXAMPLE, "api_key_id": KEY_ID, "subject": f"k:{KEY_ID}"}
    },
    ("post", T + "/adapters"): {"response": ADAPTER},
    ("post", "/admin/v1/adapters"): {"response": {**ADAPTER, "owner_tenant_id": None}},
    ("get", "/admin/v1/adapters/limits"): {"response": {
        "max_rank": 64, "max_upload_bytes": 268435456, "max_files": 8,
        "max_safetensors_header_bytes": 1048576, "max_name_length": 64, "base_model": "tiny",
        "base_models": ["tiny", "small"], "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                           "down_proj"],
    }},
    ("get", T + "/adapters"): {"response": [ADAPTER]},
    ("get", T + "/adapters/{adapter_id}"): {"response": ADAPTER},
    ("delete", T + "/adapters/{adapter_id}"): {},
    ("get", "/admin/v1/adapters"): {"response": [{**ADAPTER, "owner_tenant_id": None}]},
    ("get", T + "/adapter-aliases"): {"response": [ALIAS, PUBLIC_ALIAS]},
    ("get", A): {"response": ALIAS},
    ("put", A): {"request": {"version": 2}, "response": ALIAS},
    ("put", A + "/canary"): {"request": {"version": 3, "weight": 10}, "response": CANARY},
    ("delete", A + "/canary"): {"response": ALIAS},
    ("delete", A): {},
    ("get", "/admin/v1/adapter-aliases"): {"response": [PUBLIC_ALIAS]},
    ("get", P): {"response": PUBLIC_ALIAS},
    ("put", P): {"request": {"version": 2}, "response": PUBLIC_ALIAS},
    ("put", P + "/canary"): {"request": {"version": 3, "weight": 10},
                             "response": {**CANARY, "owner_tenant_id": None,
                                          "name": "sql-helper"}},
    ("delete", P + "/canary"): {"response": PUBLIC_ALIAS},
    ("delete", P): {},
    ("get", T + "/usage"): {"response": USAGE},
    ("get", "/admin/v1/audit"): {"response": AUDIT},
    ("get", "/admin/v1/prices"): {"response": [PRICE]},
    ("put", "/admin/v1/prices"): {
        "request": {"model": "tiny", "adapter_id": None, "prompt": "0.15", "cached": "0.075",
                    "completion": "0.60"},
        "response": PRICE,
    },
    ("get", "/admin/v1/spend"): {"response": [SPEND["total"]]},
    ("get", T + "/spend"): {"response": SPEND},
    ("post", W): {
        "request": {"url": "https://hooks.example.com/loragate", "thresholds": [50, 80, 100],
                    "events": ["budget.threshold", "outage.quota_store"], "enabled": True},
        "response": WEBHOOK_CREATED,
    },
    ("get", W): {"response": WEBHOOK},
    ("patch", W): {"request": {"thresholds": [80, 100]},
                   "response": {**WEBHOOK, "thresholds": [80, 100]}},
    ("delete", W): {},
    ("post", W + "/rotate-secret"): {"response": WEBHOOK_CREATED},
    ("post", W + "/test"): {"response": {"delivery_id": EVENT_ID}},
    ("get", W + "/deliveries"): {"response": [DELIVERY]},
}  # fmt: skip
