"""Which link a collective crosses: the one rule of the cluster's topology.

A cluster is scale-up domains (the GPUs one NVLink or Infinity Fabric fabric joins: an 8-GPU HGX
host, a 72-GPU GB200 NVL72 rack of 18 hosts) joined by the scale-out network (each GPU's NIC). Ranks
are laid out in order, domain after domain, and every process group of the mesh is a block of
consecutive ranks (or, for FSDP's shard group, strides over the tp ranks inside such a block). A
collective is as slow as its slowest group, so it runs over the scale-up links only when no group
straddles two domains.
"""

from __future__ import annotations

from typing import Literal

LinkClass = Literal["intra", "inter"]
"""`intra`: the scale-up links inside a domain; `inter`: the scale-out network between domains."""


def span_link(span: int, *, domain: int, world: int) -> LinkClass:
    """The link groups of `span` consecutive ranks cross, on a cluster of `world` ranks in domains of
    `domain`: the scale-up links when the whole cluster is one domain, or when the groups tile a
    domain exactly (`span` divides it: 8-rank groups in a 72-GPU domain); otherwise some group
    straddles two domains (16-rank groups in 72: ranks 64-79) and the network sets the pace."""
    if span <= 1 or world <= domain or domain % span == 0:
        return "intra"
    return "inter"


def domains_spanned(span: int, *, domain: int) -> int:
    """How many domains one group of `span` consecutive ranks reaches into, at most (what a
    deduplicating all-to-all sends one copy of a token to per domain)."""
    return -(-span // domain)
