"""Keyword-only data-access functions. Every mutation writes its audit event and commits."""
