"""Plan documents as older planners stored them, made from current ones (for the upgrader's tests)."""

from __future__ import annotations

from typing import Any

from contract.parallel_config import ADDED_FIELDS, ADDED_MESH_AXES

SCHEMA_1_0_MEMORY_TERMS = {"unsharded_params": "unsharded_buffers", "allocator_reserve": "fragmentation"}
"""Memory terms schema 1.0 named differently (its name for each current one); it had no `grad_buffers`."""


def as_schema_1(
    document: dict[str, Any], version: str = "1.2", *, replica_counts: bool = True
) -> dict[str, Any]:
    """A 2.x data-parallel plan as schema 1.x wrote it: every configuration's mesh (tp 1) as its two
    group sizes, `shard_group_size` and `replicate_group_size` (left out without `replica_counts`,
    as some 1.x writers did), and as 1.0 named its memory terms where `version` is 1.0."""

    def old(value: Any) -> Any:
        if isinstance(value, list):
            return [old(item) for item in value]
        if not isinstance(value, dict):
            return value
        written = {key: old(item) for key, item in value.items() if key != "mesh"}
        if "mesh" in value:
            mesh = value["mesh"]
            assert mesh["tp"] == 1, "schema 1.x had no tensor parallelism"
            written["shard_group_size"] = mesh["dp_shard"]
            if replica_counts:
                written["replicate_group_size"] = mesh["dp_replicate"]
        if version == "1.0" and "grad_buffers" in written:
            del written["grad_buffers"]
            for current, then in SCHEMA_1_0_MEMORY_TERMS.items():
                written[then] = written.pop(current)
        return written

    return {**old(document), "schema_version": version}


SCHEMA_2_2_FIELDS = ("tokens_per_s_per_gpu_interval", "peak_memory_gib_interval", "network_assumed")
"""What schema 2.2 added: the intervals beside every prediction and candidate, the assumed network."""
SCHEMA_2_2_WARNINGS = ("lead_within_interval", "network_assumed", "gpu_outside_corpus",
                       "cluster_size_outside_corpus", "degree_outside_corpus")


def as_schema_2_1(document: dict[str, Any]) -> dict[str, Any]:
    """A 2.x plan as schema 2.1 wrote it: no intervals, no `network_assumed`, none of 2.2's warnings."""

    def old(value: Any) -> Any:
        if isinstance(value, list):
            return [old(item) for item in value]
        if not isinstance(value, dict):
            return value
        return {key: old(item) for key, item in value.items() if key not in SCHEMA_2_2_FIELDS}

    written = old(document)
    if "warnings" in written:
        written["warnings"] = [w for w in written["warnings"] if w["code"] not in SCHEMA_2_2_WARNINGS]
    return {**written, "schema_version": "2.1"}


def as_schema_2_0(document: dict[str, Any]) -> dict[str, Any]:
    """A 2.x plan as schema 2.0 wrote it: no field or mesh axis added since, where the plan holds
    the value their absence meant (a plan that uses one could not have been written by 2.0)."""

    def old(value: Any) -> Any:
        if isinstance(value, list):
            return [old(item) for item in value]
        if not isinstance(value, dict):
            return value
        written = {key: old(item) for key, item in value.items()}
        if isinstance(written.get("mesh"), dict):
            for axis in ADDED_MESH_AXES:
                assert written["mesh"].pop(axis, 1) == 1, f"schema 2.0 had no {axis} axis"
            for name, neutral in ADDED_FIELDS.items():
                assert written.pop(name, neutral) == neutral, f"schema 2.0 had no {name}"
        return written

    return {**old(document), "schema_version": "2.0"}


SCHEMA_2_3_FIELDS = ("expert_memory_gib",)
"""What schema 2.3 added: a mixture-of-experts plan's peak split into experts, dispatch buffers and
dense parts."""


def as_schema_2_2(document: dict[str, Any]) -> dict[str, Any]:
    """A 2.x plan as schema 2.2 wrote it: no expert memory parts."""

    def old(value: Any) -> Any:
        if isinstance(value, list):
            return [old(item) for item in value]
        if not isinstance(value, dict):
            return value
        return {key: old(item) for key, item in value.items() if key not in SCHEMA_2_3_FIELDS}

    return {**old(document), "schema_version": "2.2"}


SCHEMA_2_4_WARNINGS = ("float8_experts_in_bf16",)
"""The warning code schema 2.4 added (with `prediction.exposed_expert_parallel_s`)."""


def as_schema_2_3(document: dict[str, Any]) -> dict[str, Any]:
    """A 2.x plan as schema 2.3 wrote it: no `prediction.exposed_expert_parallel_s`, that time
    counted in `exposed_tensor_parallel_s` instead, and none of 2.4's warnings."""
    prediction = dict(document["prediction"])
    expert_parallel = prediction.pop("exposed_expert_parallel_s", 0.0)
    prediction["exposed_tensor_parallel_s"] = prediction["exposed_tensor_parallel_s"] + expert_parallel
    warnings = [w for w in document.get("warnings", []) if w["code"] not in SCHEMA_2_4_WARNINGS]
    return {**document, "prediction": prediction, "warnings": warnings, "schema_version": "2.3"}
