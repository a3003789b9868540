"""Spend: prices per model and adapter, the cost of a request in exact micro-units, and spend
reports read from the usage ledger."""
