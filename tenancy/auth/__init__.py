"""Who is calling: API key format and verification, admin authentication (keys and OIDC), scopes and authorization, the first admin key."""
