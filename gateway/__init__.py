"""OpenAI-compatible gateway: routes, admin API, dashboard, coordinator, engine clients."""
