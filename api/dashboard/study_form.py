"""The new-study form: its fields, turning a submission into the API's `StudyCreate`, and putting every
error the API would report beside the form field it concerns.

Submissions go through `api.services.studies.create_study`, the code behind `POST /api/v1/studies`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from api.dashboard.pin_fields import PIN_FIELDS, PIN_PATHS, PinField, pin_fields, pinned_search
from api.problems import FieldError, ProblemError, field_errors
from api.schemas.plans import MAX_ID
from api.schemas.studies import StudyCreate
from api.typed_numbers import parse_decimal, parse_whole
from planner.catalog.gpus import GPU_CATALOG
from planner.specs import RACK_GPUS
from planner.study import DEFAULT_PRICES_PER_GPU_HOUR, parse_cluster_sizes, parse_token_count

FORM_LEVEL = "form"
DOMAIN_GPUS: tuple[str, ...] = tuple(name for name in GPU_CATALOG if name in RACK_GPUS)
"""The GPU types whose scale-up domain spans nodes (GB200, GB300: NVL72 racks), which the form asks for
another domain size (NVL36); the others' domain is their node."""
# API field paths (prefixes) -> form fields; `gpus.N...` are mapped by `_gpu_field`.
_FIELD_FOR_PATH: tuple[tuple[str, str], ...] = (
    ("model", "model"),
    ("name", "name"),
    ("token_budget", "token_budget"),
    ("cluster_sizes", "sizes"),
    ("seq_len", "seq_len"),
    ("global_batch_tokens", "batch_tokens"),
    ("batch_tokens_per_gpu", "batch_tokens"),
    ("batch_rule", "batch_rule"),
    ("precision", "precision"),
    ("deadline_days", "deadline_days"),
    ("gpus", "gpus"),
    *PIN_PATHS,  # each mesh axis's pin: `search.tensor_parallel_degrees` -> its field
)


@dataclass
class StudyForm:
    """The form's values as typed (strings), so that a refused form is shown back as it was sent."""

    model: str = "llama3-8b"
    name: str = ""
    token_budget: str = "1T"
    gpus: list[str] = field(default_factory=lambda: ["H100-SXM-80GB", "A100-80GB"])
    """Ticked catalog GPU types."""
    prices: dict[str, str] = field(
        default_factory=lambda: {name: f"{price:g}" for name, price in DEFAULT_PRICES_PER_GPU_HOUR.items()}
    )
    """USD per GPU-hour by GPU type (all shown; only ticked ones are sent)."""
    domains: dict[str, str] = field(default_factory=dict)
    """GPUs per scale-up domain by GPU type (DOMAIN_GPUS), as typed; empty: the GPU type's system."""
    sizes: str = "8-512"
    seq_len: str = "8192"
    batch_rule: str = "fixed"
    batch_tokens: str = "4194304"
    precision: str = "bf16"
    deadline_days: str = ""
    pins: dict[str, str] = field(default_factory=dict)
    """Each mesh axis's pin as typed, by its form field (`tensor_parallel_degree`): every candidate's
    search takes it; empty searches the axis."""
    errors: dict[str, list[str]] = field(default_factory=dict)

    def add_error(self, form_field: str, message: str) -> None:
        self.errors.setdefault(form_field, []).append(message)

    @classmethod
    def from_submission(cls, submitted: Any) -> StudyForm:
        """From a form post (a multi-dict: `gpu` repeats, `price_<GPU>` per type)."""
        form = cls()
        for name in ("model", "name", "token_budget", "sizes", "seq_len", "batch_rule", "batch_tokens",
                     "precision", "deadline_days"):
            value = submitted.get(name)
            if isinstance(value, str):
                setattr(form, name, value[:10_000])
        form.gpus = [g for g in submitted.getlist("gpu") if isinstance(g, str) and g in GPU_CATALOG]
        for gpu in GPU_CATALOG:
            price = submitted.get(f"price_{gpu}")
            if isinstance(price, str):
                form.prices[gpu] = price[:40]
        for gpu in DOMAIN_GPUS:
            domain = submitted.get(f"domain_{gpu}")
            if isinstance(domain, str):
                form.domains[gpu] = domain[:40]
        form.pins = {name: value[:40] for name in PIN_FIELDS if isinstance(value := submitted.get(name), str)}
        return form

    @property
    def pin_fields(self) -> list[PinField]:
        """The pin fields the form shows, one per axis with a search field (contract/mesh.py)."""
        return pin_fields(self.pins)

    @property
    def price_fields(self) -> dict[str, str]:
        """Form field name of each GPU type's price (ids in the page)."""
        return {gpu: f"price_{gpu}" for gpu in GPU_CATALOG}

    @property
    def domain_fields(self) -> dict[str, str]:
        """Form field name of the scale-up domain of each GPU type that takes one (DOMAIN_GPUS)."""
        return {gpu: f"domain_{gpu}" for gpu in DOMAIN_GPUS}

    @property
    def domain_defaults(self) -> dict[str, int]:
        """The scale-up domain of each of DOMAIN_GPUS' systems (72: NVL72), which an empty field keeps."""
        return {gpu: GPU_CATALOG[gpu].scaleup_domain_gpus or 0 for gpu in DOMAIN_GPUS}


def _number(form: StudyForm, name: str, raw: str, what: str, *, integer: bool) -> float | int | None:
    cleaned = raw.strip().replace(",", "").replace("_", "")
    # ASCII digits only; the API's schema then bounds the value per field.
    value = parse_whole(cleaned, low=0, high=MAX_ID) if integer else parse_decimal(cleaned)
    if value is None:
        digits = "" if cleaned.isascii() else "; use the digits 0-9"
        form.add_error(name, f"enter the {what} as a {'whole ' if integer else ''}number"
                       + (f" (got {cleaned[:40]!r}{digits})" if cleaned else ""))
    return value


def to_study_create(form: StudyForm) -> StudyCreate | None:
    """The API body for this form, or None with `form.errors` filled in."""
    body: dict[str, Any] = {"model": form.model.strip(), "precision": form.precision,
                            "batch_rule": form.batch_rule, "name": form.name.strip() or None}
    try:
        body["token_budget"] = parse_token_count(form.token_budget)
    except ValueError as exc:
        form.add_error("token_budget", str(exc))
    try:
        body["cluster_sizes"] = parse_cluster_sizes(form.sizes)
    except ValueError as exc:
        form.add_error("sizes", str(exc))
    body["seq_len"] = _number(form, "seq_len", form.seq_len, "sequence length", integer=True)
    tokens = _number(form, "batch_tokens", form.batch_tokens, "batch (tokens)", integer=True)
    body["global_batch_tokens" if form.batch_rule == "fixed" else "batch_tokens_per_gpu"] = tokens
    if form.deadline_days.strip():
        body["deadline_days"] = _number(form, "deadline_days", form.deadline_days, "deadline (days)",
                                        integer=False)
    if not form.gpus:
        form.add_error("gpus", "tick at least one GPU type")
    gpus = []
    for gpu in form.gpus:
        price = _number(form, f"price_{gpu}", form.prices.get(gpu, ""), f"{gpu} price per GPU-hour",
                        integer=False)
        candidate: dict[str, Any] = {"gpu": gpu, "price_per_gpu_hour": price}
        if form.domains.get(gpu, "").strip():  # empty: the GPU type's system, as the API's absent field
            candidate["scaleup_domain_gpus"] = _number(form, f"domain_{gpu}", form.domains[gpu],
                                                       f"{gpu} GPUs per NVLink domain", integer=True)
        gpus.append(candidate)
    body["gpus"] = gpus
    if search := pinned_search(form.pins, form.add_error):
        body["search"] = search
    if form.errors:
        return None
    try:
        return StudyCreate.model_validate(body)
    except ValidationError as exc:
        add_api_errors(form, field_errors([{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]))
        return None


def _form_field(form: StudyForm, path: str) -> str:
    parts = path.split(".")
    index = parse_whole(parts[1], low=0, high=len(form.gpus) - 1) if len(parts) >= 3 else None
    if parts[0] == "gpus" and index is not None:
        gpu = form.gpus[index]
        if parts[2] == "scaleup_domain_gpus" and gpu in DOMAIN_GPUS:
            return f"domain_{gpu}"
        return f"price_{gpu}" if parts[2] == "price_per_gpu_hour" else "gpus"
    for prefix, form_field in _FIELD_FOR_PATH:
        if path == prefix or path.startswith(prefix + "."):
            return form_field
    # Cross-field refusals name their field at the start of the message ("global_batch_tokens: ...").
    return FORM_LEVEL


def add_api_errors(form: StudyForm, errors: list[FieldError]) -> None:
    for error in errors:
        path = error.field
        if not path:
            head = error.message.split(":", 1)[0]
            path = head if any(head == p or head.startswith(p + ".") for p, _ in _FIELD_FOR_PATH) else ""
        elif path.startswith("gpus.") and path.count(".") == 1 and ":" in error.message:
            # A candidate's cross-field refusal names its field first ("scaleup_domain_gpus: 30 is ...").
            head = error.message.split(":", 1)[0]
            if head.isidentifier():
                path = f"{path}.{head}"
        target = _form_field(form, path)
        message = error.message
        for prefix in (path, path.rsplit(".", 1)[-1]):
            if prefix and message.startswith(f"{prefix}: "):
                message = message[len(prefix) + 2:]
                break
        form.add_error(target, message)


def add_problem(form: StudyForm, problem: ProblemError) -> None:
    if problem.errors:
        add_api_errors(form, problem.errors)
    else:
        form.add_error(FORM_LEVEL, str(problem.detail))
