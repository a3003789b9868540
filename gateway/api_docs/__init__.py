"""The gateway's API documentation: the OpenAPI document and `/docs` (Swagger UI, vendored in `static/`)."""
