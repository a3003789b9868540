"""What runs each step: the scheduler, the waiting line, fair sharing between tenants, and the paged KV blocks (plain Python, no model)."""
