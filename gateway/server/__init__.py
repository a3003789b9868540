"""How `loragate serve` runs uvicorn: the guarded HTTP protocol (deadlines for the request head
and body, connections per client) and the logging configuration that keeps secrets out."""
