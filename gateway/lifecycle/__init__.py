"""The request lifecycle: one owner per inference request, from admission to settlement.

`service.RequestLifecycle.serve` is what every inference route calls; `job` is the contract
with the request kinds; `planner` the shared checks; `run` the task that drives one request;
`responder` its HTTP side; `bookkeeping` settlement and the usage record; `usage_writer` the
ledger's batched writes.
"""
