"""JSON schemas of the custom resources the chart renders, transcribed from their API references
(Gateway API Inference Extension v1.5: InferencePool v1, InferenceObjective v1alpha2; Prometheus
Operator: ServiceMonitor v1), for the fields the chart uses and their rules. Unknown fields are
refused, as the API server's strict field validation does. kubernetes-validate holds the core
kinds' schemas; it has none for custom resources."""

from __future__ import annotations

from typing import Any

_NAME = {"type": "string", "minLength": 1, "maxLength": 253}
_PORT = {
    "type": "object",
    "properties": {"number": {"type": "integer", "minimum": 1, "maximum": 65535}},
    "required": ["number"],
    "additionalProperties": False,
}
_LABELS = {
    "type": "object",
    "additionalProperties": {"type": "string", "maxLength": 63},
    "minProperties": 1,
}
_METADATA = {"type": "object", "properties": {"name": _NAME}, "required": ["name"]}


def _resource(api_version: str, kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "apiVersion": {"const": api_version},
            "kind": {"const": kind},
            "metadata": _METADATA,
            "spec": spec,
        },
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "additionalProperties": False,
    }


INFERENCE_POOL = _resource("inference.networking.k8s.io/v1", "InferencePool", {
    "type": "object",
    "properties": {
        "selector": {
            "type": "object",
            "properties": {"matchLabels": _LABELS},
            "required": ["matchLabels"],
            "additionalProperties": False,
        },
        "targetPorts": {"type": "array", "items": _PORT, "minItems": 1, "maxItems": 8},
        "appProtocol": {"enum": ["http", "kubernetes.io/h2c"]},
        "endpointPickerRef": {
            "type": "object",
            "properties": {
                "group": {"type": "string"},
                "kind": {"type": "string", "minLength": 1, "maxLength": 63},
                "name": _NAME,
                "port": _PORT,
                "failureMode": {"enum": ["FailOpen", "FailClose"]},
            },
            # `port` is required when the kind is Service (the default kind).
            "required": ["name", "port"],
            "additionalProperties": False,
        },
    },
    "required": ["selector", "targetPorts", "endpointPickerRef"],
    "additionalProperties": False,
})  # fmt: skip

INFERENCE_OBJECTIVE = _resource("inference.networking.x-k8s.io/v1alpha2", "InferenceObjective", {
    "type": "object",
    "properties": {
        "priority": {"type": "integer"},
        "poolRef": {
            "type": "object",
            "properties": {
                "group": {"type": "string", "maxLength": 253},
                "kind": {"type": "string", "minLength": 1, "maxLength": 63},
                "name": _NAME,
            },
            "required": ["name"],
            "additionalProperties": False,
        },
    },
    "required": ["poolRef"],
    "additionalProperties": False,
})  # fmt: skip

_SECRET_KEY = {
    "type": "object",
    "properties": {"name": _NAME, "key": {"type": "string", "minLength": 1},
                   "optional": {"type": "boolean"}},
    "required": ["key"],
    "additionalProperties": False,
}  # fmt: skip

SERVICE_MONITOR = _resource("monitoring.coreos.com/v1", "ServiceMonitor", {
    "type": "object",
    "properties": {
        "selector": {
            "type": "object",
            "properties": {"matchLabels": _LABELS},
            "additionalProperties": False,
        },
        "endpoints": {"type": "array", "minItems": 1, "items": {
            "type": "object",
            "properties": {
                "port": {"type": "string"},
                "path": {"type": "string"},
                "interval": {"type": "string", "pattern": "^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"},
                "authorization": {
                    "type": "object",
                    "properties": {"type": {"type": "string"}, "credentials": _SECRET_KEY},
                    "additionalProperties": False,
                },
            },
            "additionalProperties": False,
        }},
    },
    "required": ["selector"],
    "additionalProperties": False,
})  # fmt: skip

BY_KIND = {
    ("inference.networking.k8s.io/v1", "InferencePool"): INFERENCE_POOL,
    ("inference.networking.x-k8s.io/v1alpha2", "InferenceObjective"): INFERENCE_OBJECTIVE,
    ("monitoring.coreos.com/v1", "ServiceMonitor"): SERVICE_MONITOR,
}
