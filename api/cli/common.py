"""What every command shares: failing with a clear message, reading JSON files, talking to a server."""

from __future__ import annotations

import json
import math
import os
import re
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from pydantic import BaseModel, ValidationError
from rich.console import Console

from api.cli.exit_codes import EXIT_FAILED, EXIT_INFEASIBLE, EXIT_INVALID_INPUT, EXIT_UNAVAILABLE
from api.cli.exit_codes import EXIT_OOM as EXIT_OOM  # validate's; re-exported with the others
from api.typed_numbers import MAX_ID, parse_decimal, parse_whole
from contract.mesh import searched_axes
from contract.plan_document import PlanError, schema_major, unwrap
from planner.bounds import MAX_GLOBAL_BATCH_TOKENS, MAX_GPUS_PER_NODE, MAX_NODES, MAX_SEQ_LEN
from planner.catalog.gpus import resolve_gpu
from planner.catalog.models import resolve_model
from planner.errors import UnknownCatalogEntryError, describe_validation_error
from planner.formatting import BITS_PER_BYTE
from planner.plan import Plan
from planner.specs import ASCII_DECIMAL, CLUSTER_PATTERN, ClusterSpec, LinkOverrideGbps, ModelSpec

if TYPE_CHECKING:
    import httpx

API_KEY_ENV = "FSDP_PLANNER_API_KEY"


CLI_OPTIONS: dict[str, str] = {
    # Each mesh axis's pin (contract/mesh.py's registry): `search.tensor_parallel_degrees` -> `--tp`.
    **{
        name: entry.option
        for entry in searched_axes()
        if entry.search_field and entry.option
        for name in (f"search.{entry.search_field}", entry.search_field)
    },
    "search.shardings": "--sharding",
    "search.checkpointing": "--checkpointing",
    "search.compile": "--compile/--eager",
    "search.float8": "--float8",
    "search.async_tp": "--async-tp",
    "search.pipeline_schedules": "--pp-schedule",
    "pipeline_schedules": "--pp-schedule",
    "training.seq_len": "--seq-len",
    "seq_len": "--seq-len",
    "training.global_batch_tokens": "--global-batch-tokens",
    "global_batch_tokens": "--global-batch-tokens",
    "training.precision": "--precision",
    "training.state_dtype": "--state-dtype",
    "gpus_per_node": "--cluster's GPUs per node",
    "scaleup_domain_gpus": "--cluster's GPUs per scale-up domain",
    "cluster.inter_node_bandwidth_gbps": "--network",
    "top_k": "--top",
    "token_budget": "--tokens",
    "cluster_sizes": "--sizes",
    "batch_tokens_per_gpu": "--batch-tokens-per-gpu",
    "deadline_days": "--deadline-days",
}
"""The option that sets each input the planner's messages name. The planner words its messages once,
naming an input by its API field (`search.tensor_parallel_degrees`, `global_batch_tokens`), which is
what the API shows; the command line shows the option instead (`in_cli_terms`). Leaf names that are
also plain words (`compile`, `precision`) are mapped only in their dotted form; a count the option
holds among others is named with it (`gpus_per_node 8` -> `--cluster's GPUs per node 8`)."""

_FIELD_NAME = re.compile(
    # Longest first, so that `training.seq_len` is one name; not inside a longer name (`max_seq_len`,
    # `model.seq_len`) or an option (`--seq-len`).
    r"(?<![\w.-])("
    + "|".join(re.escape(name) for name in sorted(CLI_OPTIONS, key=len, reverse=True))
    + r")(?!\w)"
)


MAX_TYPED_NUMBER = 10**15
"""Larger than any count, size or duration typed on the command line (the planner bounds each further)."""


SEQUENCE_SUFFIX = 1024
"""`8k` tokens per sequence: 8 x 1024. Sequence lengths are powers of two, and `8k`, `32k`, `128k`
contexts mean 8,192, 32,768 and 131,072 tokens; so only sequence lengths take the suffix (a token budget's
`15T` is decimal, `whatif --tokens`)."""


@dataclass(frozen=True, kw_only=True)
class WholeNumber:
    """The parser of a whole-number option: its unit and bounds, which its `--help` states (`describe`,
    added to every number option's help by api/cli/commands.py), and the reading of every number typed
    as text (api.typed_numbers: ASCII digits, bounded; `int()` would read '٣' as 3)."""

    unit: str
    low: int = 0
    high: int | None = None
    k_suffix: bool = False
    """Whether `8k` reads as 8 x SEQUENCE_SUFFIX (sequence lengths only)."""

    def describe(self) -> str:
        """`Range: 1 to 1,048,576 tokens; 8k = 8,192.`"""
        bounds = f"{self.low:,} to {self.high:,}" if self.high is not None else f"at least {self.low:,}"
        suffix = f"; 8k = {8 * SEQUENCE_SUFFIX:,}" if self.k_suffix else ""
        return f"Range: {bounds} {self.unit}{suffix}."

    def __call__(self, raw: str | int) -> int:
        if isinstance(raw, int):  # a default
            return raw
        high = self.high if self.high is not None else MAX_TYPED_NUMBER
        text, factor = raw.strip(), 1
        if self.k_suffix and text[-1:] in ("k", "K"):
            text, factor = text[:-1], SEQUENCE_SUFFIX
        value = parse_whole(text, low=-(-self.low // factor), high=high // factor)
        if value is None:
            bounds = self.describe().removeprefix("Range: ")
            if parse_whole(text, low=0, high=MAX_TYPED_NUMBER) is not None:
                raise typer.BadParameter(f"{raw} is out of range: give {bounds}")
            written = "whole number" + (" (or Nk)" if self.k_suffix else "")
            raise typer.BadParameter(f"{raw!r} is not a {written} in the digits 0-9; give {bounds}")
        return value * factor


@dataclass(frozen=True, kw_only=True)
class DecimalNumber:
    """The parser of a decimal option (`2.5`, `1e3`): its unit and bounds, stated in its `--help`;
    ASCII digits only, finite."""

    unit: str
    low: float = 0.0
    high: float | None = None

    def describe(self) -> str:
        bounds = f"{self.low:g} to {self.high:g}" if self.high is not None else f"at least {self.low:g}"
        return f"Range: {bounds} {self.unit}."

    def __call__(self, raw: str | float) -> float:
        if isinstance(raw, int | float):
            return float(raw)
        high = self.high if self.high is not None else float(MAX_TYPED_NUMBER)
        value = parse_decimal(raw, low=self.low, high=high)
        if value is None:
            raise typer.BadParameter(
                f"{raw!r} is not a number in the digits 0-9; {self.describe().removeprefix('Range: ')}"
            )
        return value


@dataclass(frozen=True, kw_only=True)
class WholeNumbers(WholeNumber):
    """The parser of an option holding whole numbers separated by commas (`--micro-batches 1,2,4`):
    each read and bounded as a WholeNumber, the list given back as text (`1,2,4`)."""

    def describe(self) -> str:
        """`Range: 1 to 1,048,576 sequences each, separated by commas.`"""
        return super().describe().removesuffix(".") + " each, separated by commas."

    def __call__(self, raw: str | int) -> str:  # type: ignore[override]
        if isinstance(raw, int):
            return str(raw)
        return ",".join(str(WholeNumber.__call__(self, part)) for part in raw.split(","))


NumberParser = WholeNumber | DecimalNumber


def whole_number(*, unit: str, low: int = 0, high: int | None = None, k_suffix: bool = False) -> WholeNumber:
    """A parser for a whole-number option of `unit`s in [low, high] (no upper bound where None)."""
    return WholeNumber(unit=unit, low=low, high=high, k_suffix=k_suffix)


def decimal_number(*, unit: str, low: float = 0.0, high: float | None = None) -> DecimalNumber:
    """A parser for a decimal option of `unit`s in [low, high] (no upper bound where None)."""
    return DecimalNumber(unit=unit, low=low, high=high)


SEQUENCE_TOKENS = whole_number(unit="tokens", low=1, high=MAX_SEQ_LEN, k_suffix=True)
"""`--seq-len` of every command, bounded as every plan request is (planner/bounds.py)."""
BATCH_TOKENS = whole_number(unit="tokens", low=1, high=MAX_GLOBAL_BATCH_TOKENS)
"""`--global-batch-tokens` (and a batch per GPU) of every command."""
STORED_ID = whole_number(unit="(a stored id)", low=1, high=MAX_ID)
"""A plan's or run's id on a server (`--plan-id`, `--run`)."""
TCP_PORT = whole_number(unit="(a TCP port)", low=1, high=65535)


_LINK_RULES = typing.get_args(LinkOverrideGbps)[1].metadata
_NETWORK_TEXT = re.compile(
    rf"(?P<number>{ASCII_DECIMAL.pattern})\s*(?P<prefix>[MmGgTt])(?P<unit>|b|b/s|bps|bit/s|B|B/s|Bps)"
)
"""`400G`, `400Gb/s`, `400 Gbps`, `1.6T` (bits: a NIC's port speed, `G` alone as Ethernet names it) or
`50GB/s`, `50GB` (bytes): the prefix in either case, the unit's b or B as written (bits or bytes)."""
_NETWORK_PREFIXES = {"m": 1e-3, "g": 1.0, "t": 1e3}
MAX_NETWORK_TEXT = 40
"""Longer than any bandwidth typed (`800Gb/s`, `1.6e3 Gbit/s`)."""


@dataclass(frozen=True, kw_only=True)
class NetworkBandwidth:
    """The parser of `--network`: the scale-out network's bandwidth per GPU, typed as a NIC is sold
    (`400G`, `400Gb/s`) or in bytes (`50GB/s`), read as GB/s per GPU (ClusterSpec's
    `inter_node_bandwidth_gbps`), within the bounds of its type (`LinkOverrideGbps`). A bare number is
    refused: 400 could be either unit, eight times apart."""

    unit: str = "Gb/s per GPU"
    """As its help states it (it reads GB/s too)."""
    low: float = next(rule.ge for rule in _LINK_RULES if getattr(rule, "ge", None) is not None)
    """GB/s per GPU."""
    high: float = next(rule.le for rule in _LINK_RULES if getattr(rule, "le", None) is not None)

    def describe(self) -> str:
        """`Range: 0.08 to 800,000 Gb/s per GPU (0.01 to 100,000 GB/s).`"""
        return (f"Range: {self.low * BITS_PER_BYTE:,g} to {self.high * BITS_PER_BYTE:,g} {self.unit} "
                f"({self.low:,g} to {self.high:,g} GB/s).")

    def __call__(self, raw: str | float) -> float:
        if isinstance(raw, int | float):  # a default
            return float(raw)
        text = raw.strip()
        match = _NETWORK_TEXT.fullmatch(text) if len(text) <= MAX_NETWORK_TEXT else None
        number = parse_decimal(match.group("number")) if match else None
        if match is None or number is None:
            written = ("has no unit" if parse_decimal(text) is not None
                       else "is not a bandwidth per GPU in the digits 0-9 and a unit")
            raise typer.BadParameter(
                f"{raw!r} {written}: write Gb/s per GPU as 400G (or 400Gb/s), or GB/s per GPU as 50GB/s"
            )
        gbps = number * _NETWORK_PREFIXES[match.group("prefix").lower()]
        if not match.group("unit").startswith("B"):
            gbps /= BITS_PER_BYTE
        if not self.low <= gbps <= self.high:
            raise typer.BadParameter(
                f"{raw} is out of range: give {self.describe().removeprefix('Range: ').removesuffix('.')}, "
                "e.g. 400G"
            )
        return gbps


NETWORK = NetworkBandwidth()
NetworkOption = Annotated[float | None, typer.Option(
    "--network", parser=NETWORK, metavar="BANDWIDTH",
    help="The network between nodes (between scale-up domains where those span nodes) per GPU: Gb/s as "
    "NICs are sold, 400G or 400Gb/s, or GB/s, 50GB/s. Default: the GPU type's NIC (GET /api/v1/gpus).",
)]
"""`--network` of every command that takes `--cluster`: GB/s per GPU, or None (the catalog's NIC)."""


def field_bounds(model: type[BaseModel], name: str) -> tuple[int, int]:
    """The bounds a pydantic model declares for its whole-number field `name` (`Field(ge=1, le=50)`):
    an option that sets that field states the same bounds, read from the one declaration."""
    low = high = None
    for rule in model.model_fields[name].metadata:
        low = getattr(rule, "ge", low)
        high = getattr(rule, "le", high)
    assert low is not None and high is not None, f"{model.__name__}.{name} declares no bounds"
    return int(low), int(high)


_SET_TO = re.compile(r'(?<![\w.-])cluster "([^"\s]+)"|(--[a-z-]+) \[(\d+)\]')
"""A value the planner's advice sets an input to, as the command line types it: `cluster "4x8xH100"`
-> `--cluster 4x8xH100`, and a pin of one degree, `--cp [8]` (once named as its option) -> `--cp 8`."""


def in_cli_terms(message: str) -> str:
    """`message` with every input field it names replaced by the option that sets it:
    `search.tensor_parallel_degrees: tp=3 must divide ...` -> `--tp: tp=3 must divide ...`."""
    named = _FIELD_NAME.sub(lambda match: CLI_OPTIONS[match.group(1)], message)
    return _SET_TO.sub(
        lambda m: f"--cluster {m.group(1)}" if m.group(1) else f"{m.group(2)} {m.group(3)}", named
    )


def fail(message: str | list[str], code: int = EXIT_INVALID_INPUT) -> typer.Exit:
    """Print `error: ...` lines to stderr, in the command line's terms, and return the Exit to raise."""
    err = Console(stderr=True)
    for line in [message] if isinstance(message, str) else message:
        err.print(f"[bold red]error:[/] {in_cli_terms(line)}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


def read_json_file(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise fail(f"{what}: cannot read {path}: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise fail(f"{what}: {path} is not valid JSON ({exc})") from None


def check_one_model(model: str | None, hf_config: Path | None, layer_graph: Path | None) -> None:
    if sum(x is not None for x in (model, hf_config, layer_graph)) != 1:
        raise fail("give exactly one of --model NAME, --hf-config PATH or --layer-graph PATH")


def model_from_options(*, model: str | None, hf_config: Path | None, layer_graph: Path | None) -> ModelSpec:
    """The model of `--model`, `--hf-config` or `--layer-graph` (raises PlanningError / ValidationError)."""
    check_one_model(model, hf_config, layer_graph)
    if model is not None:
        return resolve_model(model)
    if hf_config is not None:
        return resolve_model(read_json_file(hf_config, "--hf-config"))
    assert layer_graph is not None
    return resolve_model(read_json_file(layer_graph, "--layer-graph"))


def cluster_from_options(
    *, cluster: str | None, cluster_file: Path | None = None, network: float | None = None
) -> ClusterSpec:
    """The cluster of `--cluster NODESxGPUSxGPU` or `--cluster-file FILE` (exactly one), read by the
    planner's one parser with the bounds of every other spelling, on the network of `--network` (GB/s
    per GPU, over the file's) where given; a bad one fails with one line per problem (exit 2), naming
    the format or the bound."""
    if (cluster is None) == (cluster_file is None):
        raise fail("give exactly one of --cluster NODESxGPUSxGPU or --cluster-file FILE")
    if cluster is not None:
        try:
            spec = ClusterSpec.parse(cluster)
        except ValidationError as exc:
            # The string is one option: its problems name it, not the API's fields (`cluster.gpu`).
            lines = error_messages(exc, text=cluster)
            raise fail([f"--cluster {cluster}: {line}" for line in lines]) from None
    else:
        assert cluster_file is not None
        try:
            spec = ClusterSpec.model_validate(read_json_file(cluster_file, "--cluster-file"))
        except ValidationError as exc:
            lines = describe_validation_error(exc)
            raise fail([f"--cluster-file {cluster_file}: {line}" for line in lines]) from None
    if network is None:
        return spec
    # Validated again (not model_copy): the one check of every field, NETWORK having kept its bounds.
    return ClusterSpec.model_validate({**spec.model_dump(), "inter_node_bandwidth_gbps": network})


def network_unused(cluster: ClusterSpec) -> str | None:
    """Why `--network` changes nothing on `cluster`, where it does not: its GPUs share one scale-up
    fabric (one node, or one NVL72 rack), which carries all their traffic."""
    if cluster.inter_node_bandwidth_gbps is None or cluster.world_size > cluster.scaleup_gpus:
        return None
    where = "one node" if cluster.num_nodes == 1 else f"one scale-up domain of {cluster.scaleup_gpus} GPUs"
    return (f"--network: {cluster.text()} is {where}, whose GPUs talk over their scale-up fabric; the "
            "network between nodes carries none of its traffic")


CLUSTER_PARTS = {"num_nodes": "nodes", "gpus_per_node": "GPUs per node", "gpu": ""}
"""The parts of a `--cluster NODESxGPUSxGPU` string, as its refusals name them (the GPU's own message
says `unknown GPU`)."""
_CLUSTER_TEXT = re.compile(CLUSTER_PATTERN)
_BOUNDS = ("less_than_equal", "greater_than_equal")


def error_messages(exc: ValidationError, *, text: str | None = None) -> list[str]:
    """Each problem of a `--cluster` string, naming the part of the string rather than the field; a
    count out of its bounds says which bound and what to ask for instead, with a cluster to write
    where `text` (the whole cluster as typed) gives one."""
    lines = []
    for error in exc.errors():
        field = str(error["loc"][0]) if len(error["loc"]) == 1 else ""
        if field in _COUNT_WORDS and error["type"] in _BOUNDS:
            lines.append(_count_out_of_bounds(field, error, text))
            continue
        message = str(error["msg"]).removeprefix("Value error, ")
        part = CLUSTER_PARTS.get(field, field) if error["loc"] else ""
        lines.append(f"{part}: {message}" if part else message)
    return lines


_COUNT_WORDS = {
    "num_nodes": ("nodes", "a plan may span", "node", ""),
    "gpus_per_node": ("GPUs per node", "a node may hold", "GPU per node",
                      " per node, more GPUs as more nodes"),
    "scaleup_domain_gpus": ("GPUs in one scale-up domain", "one fabric may join", "GPU per domain",
                            " per domain, more GPUs as more domains"),
}
"""Each count of the cluster text: its words, what its upper bound is, its lower bound's unit, and how
to ask for as many GPUs within the upper bound."""


def _count_out_of_bounds(field: str, error: Any, text: str | None) -> str:
    """`5,000 nodes is more than the 4,096 a plan may span; ask for at most 4,096 (e.g. 4096x8xH100)`."""
    words, what, least, instead = _COUNT_WORDS[field]
    value, context = error["input"], error.get("ctx", {})
    if error["type"] == "greater_than_equal":
        return f"{value} {words}: ask for at least {context['ge']} {least}"
    bound = context["le"]
    example = _within(field, bound, text) if text is not None else None
    return (f"{value:,} {words} is more than the {bound:,} {what}; ask for at most {bound:,}{instead}"
            + (f" (e.g. {example})" if example else ""))


def _within(field: str, bound: int, text: str) -> str | None:
    """A cluster like `text` within the bound that `field` broke: as many nodes as allowed, or the same
    GPUs counted in the GPU type's own nodes (or scale-up domains); None where that is no cluster."""
    match = _CLUSTER_TEXT.fullmatch(text)
    if match is None:
        return None
    nodes, gpus, gpu = int(match.group(1) or 1), int(match.group(2)), match.group(3)
    if field == "num_nodes":
        return f"{bound}x{gpus}x{gpu}" if gpus <= MAX_GPUS_PER_NODE else None
    try:
        spec = resolve_gpu(gpu)
    except UnknownCatalogEntryError:
        return None
    unit = spec.scaleup_domain_gpus if field == "scaleup_domain_gpus" else spec.default_gpus_per_node
    if not unit or nodes > MAX_NODES:
        return None
    count = math.ceil(nodes * gpus / unit)
    if count * unit > MAX_NODES * spec.default_gpus_per_node:
        return None
    return f"{count}x{unit}x{gpu} is {count * unit:,} GPUs"


class ServerClient:
    """JSON calls to an fsdp-planner server, every failure turned into one actionable line."""

    def __init__(self, server: str, api_key: str | None = None, *, timeout_s: float = 60.0) -> None:
        self.server = server_url(server)
        self.api_key = api_key or os.environ.get(API_KEY_ENV)
        self.timeout_s = timeout_s

    def get(self, path: str, *, not_found: str | None = None) -> Any:
        """`not_found`: the message for a 404 (what is missing and where to look)."""
        return self._call("GET", path, None, not_found=not_found)

    def post(self, path: str, body: Any) -> Any:
        return self._call("POST", path, body)

    def _call(self, method: str, path: str, body: Any, *, not_found: str | None = None) -> Any:
        url = f"{self.server}/api/v1{path}"
        headers = {"Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        # httpx (0.2-0.4 s of CPU to import) only for the commands that talk to a server, when they do.
        import httpx

        try:
            response = httpx.request(method, url, headers=headers, json=body, timeout=self.timeout_s)
        except httpx.HTTPError as exc:
            raise fail(
                f"cannot reach the fsdp-planner server at {self.server} ({type(exc).__name__}: {exc}); "
                "start it with `fsdp-planner serve` or pass --server",
                EXIT_UNAVAILABLE,
            ) from None
        if response.status_code == 404 and not_found is not None:
            raise fail(not_found)
        if response.status_code in (401, 403):
            raise fail(
                f"{self.server} refused {method} {path} ({response.status_code}): pass --api-key or set "
                f"{API_KEY_ENV}"
            )
        if response.status_code >= 400:
            code = EXIT_INVALID_INPUT if response.status_code < 500 else EXIT_UNAVAILABLE
            if _problem_type(response).endswith(":infeasible-plan"):
                code = EXIT_INFEASIBLE  # as `plan` exits when nothing fits
            raise fail(
                f"{self.server} answered {response.status_code} to {method} {path}: "
                f"{problem_detail(response)}",
                code,
            )
        try:
            return response.json()
        except ValueError:
            raise fail(f"{url} did not return JSON", EXIT_UNAVAILABLE) from None


def _problem_type(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return ""
    return str(body.get("type", "")) if isinstance(body, dict) else ""


def problem_detail(response: httpx.Response) -> str:
    """The human part of an error response (a problem's `detail`), shortened."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:200] or response.reason_phrase
    if isinstance(body, dict):
        return str(body.get("detail") or body.get("title") or body)[:300]
    return str(body)[:300]


DEFAULT_SERVER = "http://127.0.0.1:8000"
"""Where `fsdp-planner serve` listens by default."""
SERVER_ENV = "FSDP_PLANNER_SERVER"
"""The server URL commands use when not given --server (validate, replan, launcher; trace's hint)."""


def configured_server() -> str:
    """The server a command talks to without --server: FSDP_PLANNER_SERVER, else serve's default."""
    return server_url(os.environ.get(SERVER_ENV) or DEFAULT_SERVER)


def server_url(raw: str) -> str:
    """A server as typed (`--server`, FSDP_PLANNER_SERVER) as a base URL: `127.0.0.1:8000` or
    `host:8000` is read as http://, what `fsdp-planner serve` speaks; another scheme is refused."""
    text = raw.strip().rstrip("/")
    scheme, sep, rest = text.partition("://")
    if not sep:
        return f"http://{text}"
    if scheme.lower() not in ("http", "https") or not rest:
        raise fail(
            f"--server {raw}: not a server URL; give http://HOST:PORT (e.g. {DEFAULT_SERVER}) or https://HOST"
        )
    return text


def cpu_precision_note(plan: Plan) -> str | None:
    """Why a bf16 plan for a CPU cluster will not predict its CPU run (None when that does not apply).

    The trainer runs CPU jobs in float32 (`--precision auto`): bf16 matmuls are slow on most CPUs.
    """
    if not plan.cluster.gpu_spec.is_cpu or plan.training.precision != "bf16":
        return None
    return ("this plan assumes bf16 but CPU runs train in float32, so their time and memory differ from "
            "the prediction; plan CPU runs with --precision fp32")


def plan_from_document(document: Any, source: str) -> Plan:
    """A Plan from a plan file or an API response (`{"id": ..., "plan": {...}}`); anything else refused."""
    document = unwrap(document)
    try:
        schema_major(document)
    except PlanError as exc:
        raise fail(f"{source}: {exc}") from None
    try:
        return Plan.model_validate(document)
    except ValidationError as exc:
        lines = describe_validation_error(exc, prefix="plan")
        raise fail([f"{source}: not a valid plan ({len(lines)} problem(s))", *lines[:5]]) from None


def load_plan(plan_file: Path | None, plan_id: int | None, server: str, api_key: str | None) -> Plan:
    """The plan named by `--plan FILE` or `--plan-id ID [--server URL]` (exactly one of them)."""
    if (plan_file is None) == (plan_id is None):
        raise fail("give exactly one of --plan FILE or --plan-id ID")
    if plan_file is not None:
        return plan_from_document(read_json_file(plan_file, "--plan"), str(plan_file))
    client = ServerClient(server, api_key)
    document = client.get(
        f"/plans/{plan_id}",
        not_found=f"plan {plan_id} does not exist on {client.server} "
        f"(list plans at {client.server}/api/v1/plans)",
    )
    return plan_from_document(document, f"{client.server}/api/v1/plans/{plan_id}")


PLAN_JOB_POLL_S = 0.5


def is_plan_job(answer: Any) -> bool:
    """Whether a POST answered with a plan job (202: a re-plan, or a plan beyond the job threshold)."""
    return isinstance(answer, dict) and "kind" in answer and "state" in answer and "plan" not in answer


def follow_plan_job(client: ServerClient, job: dict[str, Any]) -> dict[str, Any]:
    """Follow a plan job on the server (a spinner on stderr) until it has finished; then the stored plan
    (GET /plans/{plan_id}). A failed job exits with its reason, as the synchronous request would have
    (3 when nothing fits); Ctrl-C stops following, not the job."""
    import time

    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    job_id = job["id"]
    what = "re-plan" if job.get("kind") == "replan" else "plan search"
    progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                        console=Console(stderr=True), transient=True)
    try:
        with progress:
            task = progress.add_task(f"{what} job {job_id} {job['state']}", total=None)
            while job["state"] in ("queued", "running"):
                time.sleep(PLAN_JOB_POLL_S)
                job = client.get(f"/plan-jobs/{job_id}",
                                 not_found=f"plan job {job_id} is gone from the server")
                progress.update(task, description=f"{what} job {job_id} {job['state']}")
    except KeyboardInterrupt:
        raise fail(f"stopped following plan job {job_id}; it goes on on the server: "
                   f"{client.server}/plan-jobs/{job_id}", EXIT_FAILED) from None
    if job["state"] != "succeeded":
        problem = job.get("problem") or {}
        code = EXIT_FAILED
        if str(problem.get("type", "")).endswith(":infeasible-plan"):
            code = EXIT_INFEASIBLE
        elif 400 <= int(problem.get("status") or 500) < 500:
            code = EXIT_INVALID_INPUT
        raise fail(f"{what} job {job_id} failed on the server: {job.get('error')}", code)
    return client.get(f"/plans/{job['plan_id']}",
                      not_found=f"plan {job['plan_id']} was deleted on the server")


def plan_answer(client: ServerClient, answer: Any) -> Any:
    """A POST /plans (or re-plan) answer as a stored plan: a plan job is followed to its plan."""
    return follow_plan_job(client, answer) if is_plan_job(answer) else answer
