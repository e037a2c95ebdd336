"""The fields of KEDA's ScaledObject (keda.sh/v1alpha1) that deploy/k8s uses, checked as
KEDA's CRD declares them (config/crd/bases/keda.sh_scaledobjects.yaml in kedacore/keda:
`spec.scaleTargetRef.name` and `spec.triggers` required, each trigger's `type` and
`metadata` required, `metadata` a map of strings, the counts int32), and the Prometheus
scaler's metadata keys as its documentation lists them. kubernetes-validate has no
schema for custom resources, and KEDA's CRD is not on this machine: this is written from
them, and refuses any field it does not list (the CRD itself would let an unknown one
through to be pruned, which is how a typo goes unseen)."""

from __future__ import annotations

from typing import Any

import jsonschema

INT32 = {"type": "integer", "minimum": 0, "maximum": 2**31 - 1}
STRINGS = {"type": "object", "additionalProperties": {"type": "string"}}
QUANTITY = {"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)?$"}

PROMETHEUS_METADATA = {
    "type": "object",
    "required": ["serverAddress", "query", "threshold"],
    "additionalProperties": False,
    "properties": {
        "serverAddress": {"type": "string", "pattern": "^https?://"},
        "query": {"type": "string", "minLength": 1},
        "threshold": QUANTITY,
        "activationThreshold": QUANTITY,
        "namespace": {"type": "string"},
        "customHeaders": {"type": "string"},
        "ignoreNullValues": {"enum": ["true", "false"]},
        "queryParameters": {"type": "string"},
        "unsafeSsl": {"enum": ["true", "false"]},
        "timeout": {"type": "string"},
        "authModes": {"type": "string"},
    },
}

TRIGGER = {
    "type": "object",
    "required": ["type", "metadata"],
    "additionalProperties": False,
    "properties": {
        "type": {"type": "string"},
        "name": {"type": "string"},
        "metricType": {"enum": ["AverageValue", "Value", "Utilization"]},
        "useCachedMetrics": {"type": "boolean"},
        "metadata": STRINGS,
        "authenticationRef": {
            "type": "object",
            "required": ["name"],
            "additionalProperties": False,
            "properties": {"name": {"type": "string"}, "kind": {"type": "string"}},
        },
    },
    "if": {"properties": {"type": {"const": "prometheus"}}},
    "then": {"properties": {"metadata": PROMETHEUS_METADATA}},
}

SCALED_OBJECT = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "kind": {"const": "ScaledObject"},
        "metadata": {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
                "namespace": {"type": "string"},
                "labels": STRINGS,
                "annotations": STRINGS,
            },
        },
        "spec": {
            "type": "object",
            "required": ["scaleTargetRef", "triggers"],
            "additionalProperties": False,
            "properties": {
                "scaleTargetRef": {
                    "type": "object",
                    "required": ["name"],
                    "additionalProperties": False,
                    "properties": {
                        "name": {"type": "string"},
                        "kind": {"type": "string"},
                        "apiVersion": {"type": "string"},
                        "envSourceContainerName": {"type": "string"},
                    },
                },
                "minReplicaCount": INT32,
                "maxReplicaCount": INT32,
                "idleReplicaCount": INT32,
                "pollingInterval": INT32,
                "cooldownPeriod": INT32,
                "initialCooldownPeriod": INT32,
                "fallback": {
                    "type": "object",
                    "required": ["failureThreshold", "replicas"],
                    "additionalProperties": False,
                    "properties": {"failureThreshold": INT32, "replicas": INT32},
                },
                "advanced": {"type": "object"},
                "triggers": {"type": "array", "minItems": 1, "items": TRIGGER},
            },
        },
    },
}


def check_scaled_object(obj: dict[str, Any]) -> None:
    """Raise `jsonschema.ValidationError` unless `obj` is a ScaledObject as KEDA takes it,
    with min <= max replicas."""
    jsonschema.Draft202012Validator(SCALED_OBJECT).validate(obj)
    spec = obj["spec"]
    low, high = spec.get("minReplicaCount", 0), spec.get("maxReplicaCount", 100)
    if low > high:
        raise jsonschema.ValidationError(f"minReplicaCount {low} > maxReplicaCount {high}")
