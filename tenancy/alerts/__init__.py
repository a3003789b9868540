"""Budget alerts: thresholds on a tenant's (or key's) budgets, and outage notices, delivered as signed webhooks from a background worker with retries and a delivery log."""
