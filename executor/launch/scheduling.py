"""Where and how a Kubernetes job's pods are scheduled: a Kueue queue, node selectors, tolerations, a
priority class and the GPU resource name. The CLI and the API take them as strings (`key=value`,
`key=value:NoSchedule`); they are parsed and validated here, once, and laid into the manifests by
manifests.py. A bad value raises UnsafeValueError naming the option it came from.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from executor.launch.quoting import (
    QUEUE_PATTERN,
    UnsafeValueError,
    dns_subdomain,
    label_value,
    qualified_name,
)

GPU_RESOURCES: tuple[str, ...] = ("nvidia.com/gpu", "amd.com/gpu")
"""The extended resources GPU device plugins advertise: NVIDIA's and AMD's (ROCm)."""
DEFAULT_GPU_RESOURCE = "nvidia.com/gpu"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
"""The label naming the Kueue LocalQueue a job waits in (Kueue's docs: metadata.labels of the job)."""
TAINT_EFFECTS: tuple[str, ...] = ("NoSchedule", "PreferNoSchedule", "NoExecute")


@dataclass(frozen=True, slots=True)
class Scheduling:
    """Validated scheduling options of the Kubernetes manifests (the defaults add nothing)."""

    queue: str | None = None
    """Kueue LocalQueue: the job carries its label and is created suspended until Kueue admits it."""
    node_selector: tuple[tuple[str, str], ...] = ()
    """(label key, value) pairs every pod's node must carry."""
    tolerations: tuple[dict[str, str], ...] = ()
    """Pod tolerations, as the PodSpec writes them (key, operator, value, effect)."""
    priority_class: str | None = None
    """PriorityClass of the pods (Kueue takes the workload's priority from it too)."""
    gpu_resource: str = DEFAULT_GPU_RESOURCE
    """The resource each pod's GPUs are requested as."""

    def pod_fields(self) -> dict[str, Any]:
        """What the options add to a PodSpec ({} for the defaults)."""
        fields: dict[str, Any] = {}
        if self.node_selector:
            fields["nodeSelector"] = dict(self.node_selector)
        if self.tolerations:
            fields["tolerations"] = [dict(t) for t in self.tolerations]
        if self.priority_class:
            fields["priorityClassName"] = self.priority_class
        return fields


def scheduling(
    *,
    queue: str | None = None,
    node_selector: Iterable[str] = (),
    tolerations: Iterable[str] = (),
    priority_class: str | None = None,
    gpu_resource: str = DEFAULT_GPU_RESOURCE,
) -> Scheduling:
    """The options from their strings: `node_selector` as `key=value`, `tolerations` as
    `key[=value][:Effect]` (kubectl taint's syntax: without a value the key need only exist, without an
    effect every effect is tolerated)."""
    if queue is not None and not re.fullmatch(QUEUE_PATTERN, queue):
        raise UnsafeValueError(
            f"queue {queue!r}: give the name of a Kueue LocalQueue in the job's namespace (lowercase "
            "letters, digits, '-' and '.', at most 63: the value of the kueue.x-k8s.io/queue-name label)",
            field="queue",
        )
    if gpu_resource not in GPU_RESOURCES:
        raise UnsafeValueError(
            f"gpu_resource {gpu_resource!r}: choose one of {', '.join(GPU_RESOURCES)}", field="gpu_resource"
        )
    if priority_class is not None:
        dns_subdomain(priority_class, field="priority_class")
    return Scheduling(
        queue=queue,
        node_selector=_node_selector(node_selector),
        tolerations=tuple(toleration(text) for text in tolerations),
        priority_class=priority_class,
        gpu_resource=gpu_resource,
    )


def _node_selector(pairs: Iterable[str]) -> tuple[tuple[str, str], ...]:
    selected: dict[str, str] = {}
    for text in pairs:
        key, equals, value = text.partition("=")
        if not equals:
            raise UnsafeValueError(
                f"node_selector {text!r}: give key=value, e.g. node.kubernetes.io/instance-type=p5.48xlarge",
                field="node_selector",
            )
        qualified_name(key, field="node_selector")
        label_value(value, field="node_selector")
        if selected.get(key, value) != value:
            raise UnsafeValueError(
                f"node_selector: {key} given twice ({selected[key]!r} and {value!r}); a node has one value",
                field="node_selector",
            )
        selected[key] = value
    return tuple(selected.items())


def toleration(text: str) -> dict[str, str]:
    """One toleration from `key[=value][:Effect]`, as the PodSpec writes it."""
    rest, colon, effect = text.rpartition(":") if ":" in text else (text, "", "")
    if colon and effect not in TAINT_EFFECTS:
        raise UnsafeValueError(
            f"toleration {text!r}: the effect after ':' is one of {', '.join(TAINT_EFFECTS)}",
            field="toleration",
        )
    key, equals, value = rest.partition("=")
    qualified_name(key, field="toleration")
    tolerated = {"key": key, "operator": "Equal" if equals else "Exists"}
    if equals:
        tolerated["value"] = label_value(value, field="toleration")
    if effect:
        tolerated["effect"] = effect
    return tolerated
