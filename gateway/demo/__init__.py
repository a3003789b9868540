"""`loragate demo`: the one-command demo on the embedded default, and its generated adapters."""
