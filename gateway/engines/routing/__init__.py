"""Which engine replica a request goes to (HTTP mode): prefix keys (prefix.py), the map of where
each prefix was last served (affinity.py), the policies as pure functions over replicas
(policy.py), and the router that holds their state for one engine client (router.py)."""
