"""The request lifecycle: one owner per inference request, from admission to settlement.

`service.RequestLifecycle.serve` is what every inference route calls, and `service.respond` its
one whole-or-streamed responder; `job` is the contract with the request kinds and the checks
their plans share; `run` the task that drives one request; `bookkeeping` settlement, the usage
record and the ledger's batched writes.
"""
