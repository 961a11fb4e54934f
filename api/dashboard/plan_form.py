"""The new-plan form: its fields, turning a submission into the API's `PlanCreate`, putting every
error the API would report beside the form field it concerns, and the hint under the batch.

Submissions go through `api.services.plans.create_plan`, the code behind `POST /api/v1/plans`, so the
form and the API validate, deduplicate and store plans identically; the batch hint is the planner's
pre-check on the same request (planner/precheck.py), so it names the batches the refusal would; like
the refusal's advice, it is priced in the app's search pool, not in the web process.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from pydantic import ValidationError
from sqlalchemy.orm import Session

from api.dashboard.pin_fields import PIN_FIELDS, PIN_PATHS, PinField, pin_fields, pinned_search
from api.problems import FieldError, ProblemError, field_errors
from api.schemas.plans import MAX_ID, PlanCreate
from api.services.plans import build_request, calibration_profile
from api.services.search_pool import SearchPool, SearchPoolBrokenError
from api.text_check import JsonTextError, load_json_text
from api.typed_numbers import parse_id, parse_whole
from planner.catalog.gpus import GPU_CATALOG
from planner.catalog.models import MODEL_CATALOG
from planner.cost.model_costs import count_parameters
from planner.formatting import quantity
from planner.precheck import BATCH_FIELD

# Where errors go that concern no single field (e.g. "no configuration fits on this cluster").
FORM_LEVEL = "form"
# API field paths (prefixes) -> form fields; the first match wins, so longer paths come first.
_FIELD_FOR_PATH: tuple[tuple[str, str], ...] = (
    ("cluster.num_nodes", "num_nodes"),
    ("cluster.gpus_per_node", "gpus_per_node"),
    ("cluster.gpu", "gpu"),
    ("cluster.scaleup_domain_gpus", "scaleup_domain_gpus"),
    ("cluster", "cluster"),
    ("training.seq_len", "seq_len"),
    ("training.global_batch_tokens", "global_batch_tokens"),
    ("training.precision", "precision"),
    ("training.optimizer", "optimizer"),
    ("training.state_dtype", "state_dtype"),
    ("training", "training"),
    ("calibration_id", "calibration_id"),
    ("name", "name"),
    *PIN_PATHS,  # each mesh axis's pin: `search.tensor_parallel_degrees` -> its field
)
MAX_FIELD_CHARS = 10_000
"""Longer than any field a person types: what a submitted value is cut to."""
INTEGER_FIELDS = {
    "num_nodes": "number of nodes",
    "gpus_per_node": "GPUs per node",
    "seq_len": "sequence length",
    "global_batch_tokens": "global batch",
}
OPTIONAL_INTEGER_FIELDS = {"scaleup_domain_gpus": "GPUs per scale-up domain"}
"""Whole-number fields that may be left empty (the API's default then)."""


@dataclass
class PlanForm:
    """The form's values as typed (strings), so that a form with errors is shown back as it was sent."""

    model_source: str = "catalog"
    """`catalog` (a name from the select) or `config` (a pasted Hugging Face config.json)."""
    model: str = "llama3-8b"
    model_config: str = ""
    name: str = ""
    num_nodes: str = "1"
    gpus_per_node: str = "8"
    gpu: str = "H100-SXM-80GB"
    scaleup_domain_gpus: str = ""
    """GPUs per scale-up (NVLink, Infinity Fabric) domain as typed; empty: the GPU type's system."""
    seq_len: str = "8192"
    global_batch_tokens: str = "131072"
    precision: str = "bf16"
    optimizer: str = "adamw"
    state_dtype: str = "float32"
    """What the optimizer updates: `float32` (mixed precision) or `bfloat16` (pure bf16 training)."""
    calibration_id: str = ""
    pins: dict[str, str] = field(default_factory=dict)
    """Each mesh axis's pin as typed, by its form field (`tensor_parallel_degree`, `Axis.form_field`):
    empty searches the axis, a number pins it."""
    errors: dict[str, list[str]] = field(default_factory=dict)

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> PlanForm:
        """A form from submitted or linked values (a query string, a form post): the known fields that
        are text, each cut to MAX_FIELD_CHARS; the rest ignored."""
        typed = {k: v[:MAX_FIELD_CHARS] for k, v in values.items() if isinstance(v, str)}
        known = {f.name for f in fields(cls)} - {"pins", "errors"}
        pins = {name: typed[name] for name in PIN_FIELDS if name in typed}
        return cls(**{k: v for k, v in typed.items() if k in known}, pins=pins)

    @property
    def pin_fields(self) -> list[PinField]:
        """The pin fields the form shows, one per axis with a search field (contract/mesh.py)."""
        return pin_fields(self.pins)

    @property
    def model_field(self) -> str:
        return "model_config" if self.model_source == "config" else "model"

    def add_error(self, form_field: str, message: str) -> None:
        self.errors.setdefault(form_field, []).append(message)

    def values(self) -> dict[str, Any]:
        """The form's fields as a query string carries them (the pins flat, by form field)."""
        values = asdict(self)
        values.pop("errors")
        values.pop("pins")
        return {**values, **{name: self.pins.get(name, "") for name in PIN_FIELDS}}


def _integer(form: PlanForm, name: str) -> int | None:
    # Digit-group separators are allowed ("131,072"); the API's schema then bounds the value per field.
    raw = getattr(form, name).strip().replace(",", "").replace("_", "")
    value = parse_whole(raw, low=0, high=MAX_ID)
    if value is None:
        what = INTEGER_FIELDS.get(name) or OPTIONAL_INTEGER_FIELDS[name]
        form.add_error(name, f"enter the {what} as a whole number" +
                       (f" (got {raw[:40]!r})" if raw else ""))
    return value


def _model(form: PlanForm) -> str | dict[str, Any] | None:
    if form.model_source != "config":
        if not form.model.strip():
            form.add_error("model", "choose a model from the catalog, or paste a config.json")
        return form.model.strip() or None
    text = form.model_config.strip()
    if not text:
        form.add_error("model_config", "paste the model's Hugging Face config.json here")
        return None
    try:
        document = load_json_text(text)
    except JsonTextError as exc:
        form.add_error("model_config", str(exc))
        return None
    if not isinstance(document, dict):
        form.add_error("model_config", "a config.json is a JSON object ({...})")
        return None
    return document


def to_plan_create(form: PlanForm) -> PlanCreate | None:
    """The API body for this form, or None with `form.errors` filled in."""
    model = _model(form)
    numbers = {name: _integer(form, name) for name in INTEGER_FIELDS}
    calibration_id = parse_id(form.calibration_id) if form.calibration_id.strip() else None
    if form.calibration_id.strip() and calibration_id is None:
        form.add_error("calibration_id", "choose a stored calibration profile, or none")
    domain = _integer(form, "scaleup_domain_gpus") if form.scaleup_domain_gpus.strip() else None
    search = pinned_search(form.pins, form.add_error)
    if form.errors:
        return None
    cluster = {"num_nodes": numbers["num_nodes"], "gpus_per_node": numbers["gpus_per_node"],
               "gpu": form.gpu.strip()}
    if domain is not None:  # empty: the GPU type's system, as the API's absent field
        cluster["scaleup_domain_gpus"] = domain
    body: dict[str, Any] = {
        "model": model,
        "cluster": cluster,
        "training": {"seq_len": numbers["seq_len"], "global_batch_tokens": numbers["global_batch_tokens"],
                     "precision": form.precision, "optimizer": form.optimizer,
                     "state_dtype": form.state_dtype},
        "name": form.name.strip() or None,
        "calibration_id": calibration_id,
    }
    if search:
        body["search"] = search
    try:
        return PlanCreate.model_validate(body)
    except ValidationError as exc:
        add_api_errors(form, field_errors([{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]))
        return None


def _strip_path(message: str, path: str) -> str:
    # The planner starts many messages with the field path, which is redundant beside that field.
    for prefix in (path, path.rsplit(".", 1)[-1]):
        if prefix and message.startswith(f"{prefix}: "):
            return message[len(prefix) + 2:]
    return message


def form_field_for(form: PlanForm, path: str) -> str:
    if path == "model" or path.startswith("model."):
        return form.model_field
    for prefix, form_field in _FIELD_FOR_PATH:
        if path == prefix or path.startswith(prefix + "."):
            return form_field
    return FORM_LEVEL


def add_api_errors(form: PlanForm, errors: list[FieldError]) -> None:
    for error in errors:
        form.add_error(form_field_for(form, error.field), _strip_path(error.message, error.field))


def add_problem(form: PlanForm, problem: ProblemError) -> None:
    """A refused plan: its field errors beside their fields, or its detail at the top of the form."""
    if problem.errors:
        add_api_errors(form, problem.errors)
    else:
        form.add_error(FORM_LEVEL, str(problem.detail))


def batch_hint_for(
    form: PlanForm, session: Session, *, max_model_layers: int, search_pool: SearchPool
) -> str:
    """The line under the batch field: the sequences a step holds, or why the batch does not split over
    this cluster and which batches near it plan there, priced as the submission's search would be
    (with its calibration), in `search_pool` under its deadline. Empty while other fields are wrong:
    their own errors show on submit."""
    body = to_plan_create(form)
    if body is None:
        return ""
    try:
        request = build_request(body, max_model_layers=max_model_layers, search_pool=search_pool)
        profile = calibration_profile(session, body.calibration_id, request)
        calibration_id = None if body.calibration_id is None else str(body.calibration_id)
        session.commit()  # hold no pooled connection while the hint is priced
        hint = search_pool.batch_hint(request, profile, calibration_id)
    except ProblemError as problem:
        batch = [e.message for e in problem.errors or [] if e.field == BATCH_FIELD]
        return _strip_path(batch[0], BATCH_FIELD) if batch else ""
    except SearchPoolBrokenError:
        return ""  # the submission says what went wrong
    return _strip_path(hint, BATCH_FIELD)


@dataclass(frozen=True)
class Choice:
    value: str
    label: str


def model_choices() -> list[Choice]:
    return [Choice(name, f"{name} ({quantity(count_parameters(spec))} parameters)")
            for name, spec in MODEL_CATALOG.items()]


def domain_defaults() -> str:
    """The scale-up domains the GPU types' systems default to where one spans nodes, for the form's
    help: `72 for GB200 and GB300 (NVL72 racks of nodes of 4)`."""
    racks: dict[tuple[int, int], list[str]] = {}
    for gpu in GPU_CATALOG.values():
        if gpu.scaleup_domain_gpus and gpu.scaleup_domain_gpus > gpu.default_gpus_per_node:
            racks.setdefault((gpu.scaleup_domain_gpus, gpu.default_gpus_per_node), []).append(gpu.name)
    return "; ".join(
        f"{domain} for {' and '.join(names)} (racks of nodes of {node})"
        for (domain, node), names in racks.items()
    )


def gpu_choices() -> list[Choice]:
    return [Choice(gpu.name, f"{gpu.name} ({gpu.memory_gib:g} GiB)") for gpu in GPU_CATALOG.values()]
