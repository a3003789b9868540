"""Tenants, API keys, quotas, cache salts, priority tiers, usage and audit (SQL + Redis)."""
