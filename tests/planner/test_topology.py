"""Scale-up domains beyond the host (GB200 NVL72: nodes of 4 in one 72-GPU NVLink domain): how a
cluster spells them, the one rule that says which link a group's collectives cross, and what the
search makes of it."""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError

from contract.mesh import Mesh
from contract.topology import domains_spanned, span_link
from planner.hashing import plan_hash
from planner.search import make_plan
from planner.specs import CLUSTER_SCHEMA_PATTERN, ClusterSpec, SearchSpace
from tests.planner.conftest import make_request


@pytest.mark.parametrize(
    ("span", "domain", "world", "link"),
    [
        (8, 8, 64, "intra"),  # an HGX host's tp group
        (16, 8, 64, "inter"),  # two hosts
        (8, 72, 288, "intra"),  # nine 8-rank groups tile an NVL72 rack
        (16, 72, 288, "inter"),  # ranks 64-79 straddle two racks
        (72, 72, 288, "intra"),
        (6, 8, 24, "inter"),  # ranks 6-11 straddle two hosts
        (16, 72, 64, "intra"),  # the whole cluster is one domain
        (1, 8, 64, "intra"),
    ],
)
def test_one_rule_says_which_link_a_group_crosses(span: int, domain: int, world: int, link: str) -> None:
    assert span_link(span, domain=domain, world=world) == link


def test_an_all_to_all_reaches_as_many_domains_as_its_span_covers() -> None:
    assert [domains_spanned(s, domain=8) for s in (1, 8, 9, 64)] == [1, 1, 2, 8]


def test_mesh_links_follow_the_domain_not_the_host() -> None:
    mesh = Mesh(dp_shard=72, ep=16, tp=4)  # 288 ranks
    assert mesh.expert_link(72) == "inter" and mesh.expert_link(288) == "intra"
    assert Mesh(dp_shard=36, ep=2, tp=4).expert_link(72) == "intra"  # 8 ranks tile 72
    assert Mesh(dp_shard=18, dp_replicate=4, tp=4).shard_link(72) == "intra"
    assert Mesh(dp_shard=18, dp_replicate=4, tp=4).shard_link(8) == "inter"


def test_racks_are_spelt_as_sold_and_read_as_nodes_in_domains() -> None:
    racks = ClusterSpec.parse("4x72xGB200")
    assert (racks.num_nodes, racks.gpus_per_node, racks.scaleup_gpus, racks.world_size) == (72, 4, 72, 288)
    assert racks == ClusterSpec.parse("72x4xGB200")  # the catalog's NVL72 domain by default
    assert racks.model_dump() == ClusterSpec.parse("72x4xGB200").model_dump()
    partial = ClusterSpec.parse("4x64xGB200")  # 16 of a rack's 18 trays, as jobs often take
    assert (partial.num_nodes, partial.gpus_per_node, partial.scaleup_gpus) == (64, 4, 64)
    hosts = ClusterSpec.parse("36x8xGB200")  # NVLink domains of 8 (two trays), like HGX hosts
    assert (hosts.num_nodes, hosts.gpus_per_node, hosts.scaleup_gpus) == (72, 4, 8)
    assert ClusterSpec.parse("1x4xGB300").scaleup_gpus == 4  # a tray of a rack: the cluster is one domain


def test_old_spellings_read_and_serialise_as_before() -> None:
    for text, fields in [
        ("2x8xH100", (2, 8, 8)), ("8xMI300X", (1, 8, 8)), ("1x16xH100", (1, 16, 16)), ("4x4xL40S", (4, 4, 4)),
    ]:
        cluster = ClusterSpec.parse(text)
        assert (cluster.num_nodes, cluster.gpus_per_node, cluster.scaleup_gpus) == fields
        assert "scaleup_domain_gpus" not in cluster.model_dump()
    with pytest.raises(ValidationError, match="less than or equal to 64"):
        ClusterSpec.parse("1x72xH100")  # no H100 system's NVLink spans hosts: still a node too large


def test_a_domain_is_whole_nodes() -> None:
    with pytest.raises(ValidationError, match="scaleup_domain_gpus: 6 is not a whole number of 4-GPU nodes"):
        ClusterSpec(num_nodes=18, gpus_per_node=4, gpu="GB200", scaleup_domain_gpus=6)
    explicit = ClusterSpec(num_nodes=4, gpus_per_node=8, gpu="H100", scaleup_domain_gpus=32)
    assert explicit.scaleup_gpus == 32 and explicit.model_dump()["scaleup_domain_gpus"] == 32


def test_an_old_request_hashes_as_before() -> None:
    """The same request spelt before and after domains existed (no key) hashes the same."""
    request = make_request("llama3-8b", "2x8xH100", seq_len=4096, sequences=32)
    spelt = request.model_copy(update={"cluster": ClusterSpec.model_validate(
        {"num_nodes": 2, "gpus_per_node": 8, "gpu": "H100"})})
    assert plan_hash(request) == plan_hash(spelt)
    assert "scaleup_domain_gpus" not in request.model_dump(mode="json")["cluster"]


def _plan(model: str, cluster: str, *, seq_len: int, sequences: int, **search: object):
    request = make_request(model, cluster, seq_len=seq_len, sequences=sequences,
                           search=SearchSpace(**search) if search else SearchSpace())
    return request, make_plan(request)


def test_llama3_405b_keeps_tp_inside_an_nvl72_rack_and_gains_from_it() -> None:
    racks, plan = _plan("llama3-405b", "4x72xGB200", seq_len=8192, sequences=1152)
    mesh = plan.config.mesh
    assert mesh.tp > 1 and span_link(mesh.tp, domain=72, world=288) == "intra"
    hosts, on_hosts = _plan("llama3-405b", "36x8xGB200", seq_len=8192, sequences=1152)
    assert hosts.cluster.world_size == racks.cluster.world_size
    # The same GPUs, the shard group's traffic spread over a rack's NICs and NVLink, not a host's.
    assert plan.prediction.tokens_per_s_per_gpu > 1.05 * on_hosts.prediction.tokens_per_s_per_gpu


def test_deepseek_v3_keeps_ep_inside_the_nvlink_domain_and_gains_from_it() -> None:
    search = {"shardings": ["full_shard"], "checkpointing": ["full"], "compile": [True]}
    racks, plan = _plan("deepseek-v3", "4x64xGB200", seq_len=4096, sequences=4096, **search)
    mesh = plan.config.mesh
    assert mesh.ep * mesh.tp > 8  # beyond any host, inside the rack
    assert mesh.expert_link(racks.cluster.scaleup_gpus) == "intra"
    _, on_hosts = _plan("deepseek-v3", "32x8xGB200", seq_len=4096, sequences=4096, **search)
    assert on_hosts.config.mesh.ep * on_hosts.config.mesh.tp <= 8
    assert plan.prediction.tokens_per_s_per_gpu > 1.1 * on_hosts.prediction.tokens_per_s_per_gpu


def test_a_cluster_is_spelt_back_as_it_reads() -> None:
    for text in ("2x8xH100", "72x4xGB200", "4x64xGB200", "2x36xGB300"):
        cluster = ClusterSpec.parse(text)
        assert ClusterSpec.parse(cluster.text()) == cluster
    assert ClusterSpec.parse("4x64xGB200").text(num_nodes=32) == "2x64xGB200"


def test_a_plan_headline_names_domains_that_span_nodes() -> None:
    assert ClusterSpec.parse("4x72xGB200").domains() == " in scale-up domains of 72"
    assert ClusterSpec.parse("2x8xH100").domains() == ""


def test_a_rack_count_is_whole_nodes_and_the_schema_says_which_gpus_take_one() -> None:
    with pytest.raises(ValidationError, match="70 GPUs is not a whole number of GB200's 4-GPU nodes"):
        ClusterSpec.parse("1x70xGB200")
    with pytest.raises(ValidationError, match="73,728 nodes of 4, more than 4,096"):
        ClusterSpec.parse("4096x72xGB200")
    schema = re.compile(CLUSTER_SCHEMA_PATTERN)
    assert schema.fullmatch("4x72xGB200") and schema.fullmatch("2x36xgb300-nvl72")
    assert not schema.fullmatch("1x72xH100") and schema.fullmatch("1x64xH100")
