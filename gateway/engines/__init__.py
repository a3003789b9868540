"""Engine clients: the protocol the gateway relies on (`api`), the in-process engine
(`inprocess`, the embedded default) and HTTP replicas (`http`, over `http_wire`, routed by
`routing/` and `replicas`). `build` picks one from the settings; `pools` holds one per served
base model (several with LORAGATE_MODELS)."""
