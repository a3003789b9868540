"""The append-only audit log: `write` records every admin mutation, `read` serves it scoped to the caller."""
