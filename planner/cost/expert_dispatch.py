"""The expert-parallel all-to-alls of a mixture-of-experts block: how many bytes of each token cross
which links, and how long the dispatch and the combine take.

Two ways to move tokens to their experts are priced, as `CostParameters.expert_dispatch` names them:

- `copies`: every routed row is sent on its own (`all_to_all_single` over the rows permuted by expert,
  as torchtitan and this project's runtime do): a token's hidden state travels top-k times.
- `deduplicated`: DeepEP-class kernels (DeepEP, HybridEP) send a token's hidden state once to each
  *rank* that holds one of its experts over NVLink, and once to each *node* over the network (the
  receiving node forwards it over NVLink), then expand it to the experts there.

How many ranks and nodes a token reaches depends on where its top-k experts sit
(`CostParameters.expert_placement`): a learned router, or a forced balance that draws random scores,
spreads them as k distinct experts drawn at random; a benchmark gate that gives token t the experts
t*k .. t*k + k - 1 packs them into as few consecutive experts, so ranks, as they span.
"""

from __future__ import annotations

import math
from typing import Literal

ExpertDispatch = Literal["copies", "deduplicated"]
ExpertPlacement = Literal["random", "contiguous"]


def destinations(*, experts: int, top_k: int, groups: int, placement: ExpertPlacement) -> float:
    """Expected number of `groups` equal, consecutive groups of the `experts` (ranks or nodes) that one
    token's `top_k` distinct experts fall in."""
    if groups <= 1 or experts <= 0:
        return 1.0
    top_k = min(top_k, experts)
    per_group = experts / groups
    if placement == "contiguous":  # aligned runs of k experts
        return float(min(groups, math.ceil(top_k / per_group)))
    # k distinct experts at random: a group is missed when all k fall outside its experts.
    missed = 1.0
    for i in range(top_k):
        missed *= max(0.0, (experts - per_group - i) / (experts - i))
    return groups * (1.0 - missed)


def dispatch_bytes_per_token(
    *, hidden: int, act_bytes: int, experts: int, top_k: int, groups: int, dispatch: ExpertDispatch,
    placement: ExpertPlacement,
) -> float:
    """Bytes of one token's hidden state one dispatch sends towards `groups` groups (ranks or nodes),
    its own group's share included (the collective's (n - 1) / n takes it out)."""
    copies = float(top_k)
    if dispatch == "deduplicated":
        copies = destinations(experts=experts, top_k=top_k, groups=groups, placement=placement)
    return copies * hidden * act_bytes


__all__ = ["ExpertDispatch", "ExpertPlacement", "destinations", "dispatch_bytes_per_token"]
