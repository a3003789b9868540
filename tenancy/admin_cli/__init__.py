"""The admin REST API from a shell (`loragate admin tenants|keys|quotas|adapters|usage|audit|
login`): a client of the API, never of the database. See commands.py."""

from tenancy.admin_cli.parser import add_rest_commands

__all__ = ["add_rest_commands"]
