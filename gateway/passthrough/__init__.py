"""`/inference/v1/generate` passed through with the tenant's policy applied: the job (parse,
validate, policy fields) and its output (the engine's events with the client's request id)."""
