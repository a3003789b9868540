"""The gateway's HTTP routes: thin functions that parse, call a service and shape the answer."""
