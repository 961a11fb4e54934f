"""Plan documents as older planners stored them, made from current ones (for the upgrader's tests)."""

from __future__ import annotations

from typing import Any


def as_schema_1(document: dict[str, Any], version: str = "1.2") -> dict[str, Any]:
    """A 2.x data-parallel plan as schema 1.x wrote it: every configuration's mesh (tp 1) as its two
    group sizes, `shard_group_size` and `replicate_group_size`."""

    def old(value: Any) -> Any:
        if isinstance(value, list):
            return [old(item) for item in value]
        if not isinstance(value, dict):
            return value
        written = {key: old(item) for key, item in value.items() if key != "mesh"}
        if "mesh" in value:
            mesh = value["mesh"]
            assert mesh["tp"] == 1, "schema 1.x had no tensor parallelism"
            written |= {"shard_group_size": mesh["dp_shard"], "replicate_group_size": mesh["dp_replicate"]}
        return written

    return {**old(document), "schema_version": version}
