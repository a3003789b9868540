"""The tenancy database: the SQLAlchemy schema, the async engine and sessions, and Alembic's migrations."""
