"""The dashboard's pages: plans (list, new, detail, compare), what-if studies, calibrations, accuracy.

Handlers stay thin: they read through `queries` / `api.services`, shape data with the `*_views`
modules, and render a template. Sync handlers run in FastAPI's thread pool (database calls and the
planner's search block); the form handler is async only to read the form, then hops to the pool.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from api import keys
from api.dashboard import (
    access,
    accuracy_views,
    calibration_views,
    pipeline_views,
    plan_form,
    plan_views,
    queries,
    study_form,
    study_views,
)
from api.dashboard.plan_list import COLUMNS, SHARDINGS, ListingState
from api.dashboard.rendering import error_page, mark_dashboard_request, render
from api.deps import SessionDep, SettingsDep, run_planning, search_share
from api.problems import ProblemError
from api.schemas.plans import MAX_ID, ReplanCreate, stored_mesh
from api.services import plan_compare, plan_listing
from api.services import plan_jobs as plan_job_service
from api.services import plans as plan_service
from api.services import studies as study_service
from api.services.fidelity import served_report
from api.services.plan_documents import UnreadablePlanError, read_plan
from api.typed_numbers import parse_id, parse_whole
from contract.mesh import searched_axes
from contract.training_config import Optimizer, Precision, StateDType
from executor.launch.torchtitan import NotOnTorchtitanError
from executor.launch.torchtitan import flavor_of as torchtitan_flavor
from planner.catalog.models import MODEL_CATALOG
from planner.plan import Plan
from planner.rejected_summary import summarize_rejected

router = APIRouter(
    include_in_schema=False,
    # Cross-site posts are refused before anything else: even a 401 is more than another site should learn.
    dependencies=[
        Depends(mark_dashboard_request), Depends(access.refuse_cross_site_posts),
        Depends(access.require_read_access),
    ],
)

STUDIES_PER_PAGE = 25
LAUNCHER_TARGETS = (
    ("torchrun", "target=torchrun", "torchrun"),
    ("slurm", "target=slurm", "SLURM"),
    ("k8s", "target=k8s", "Kubernetes"),
    ("skypilot", "target=skypilot", "SkyPilot"),
    ("all", "target=all", "all targets"),
    ("torchtitan", "target=torchtitan", "torchtitan job"),
    ("torchtitan-0.2", "target=torchtitan&torchtitan_version=0.2", "torchtitan 0.2.x job (TOML)"),
)
"""The plan page's launcher downloads: (the button's id suffix, the launcher query, its label)."""


def _torchtitan_refused(plan: Plan) -> str | None:
    """Why the plan has no torchtitan job (its model is not in torchtitan's registry), or None: the page
    says so in place of the download."""
    try:
        torchtitan_flavor(plan)
    except NotOnTorchtitanError as exc:
        return str(exc).removeprefix("target torchtitan: ")
    return None


def _parse_id(raw: str, what: str) -> int:
    """A path's id, or a 404 page that says what ids look like."""
    parsed = parse_id(raw)
    if parsed is None:
        raise StarletteHTTPException(
            404, f"There is no {what} {raw[:40]!r}: ids are whole numbers from 1 to {MAX_ID}."
        )
    return parsed


@router.get("/", response_class=HTMLResponse)
def plans_page(request: Request, session: SessionDep) -> HTMLResponse:
    state = ListingState.from_query(request.query_params)
    notices = list(state.notices)
    try:
        rows, next_cursor = plan_listing.list_plans(
            session, filters=state.filters(), sort=state.sort, order=state.order, limit=state.limit,
            cursor=state.cursor,
        )
    except ProblemError:
        # A cursor from another sort or filter (an edited or stale link): start from the first page.
        notices.append("That page link no longer matches the sort or filters; showing the first page.")
        state = dataclasses.replace(state, cursor=None)
        rows, next_cursor = plan_listing.list_plans(
            session, filters=state.filters(), sort=state.sort, order=state.order, limit=state.limit,
            cursor=None,
        )
    total = queries.count_plans(session, state.filters())
    choices = queries.distinct_values(session)
    return render(request, "plans.html", {
        "active": "plans", "rows": rows, "state": state, "columns": COLUMNS, "total": total,
        "next_href": state.href(cursor=next_cursor) if next_cursor else None,
        "first_href": state.href(cursor=None) if state.cursor else None,
        "models": choices.models, "gpus": choices.gpus, "shardings": SHARDINGS,
        "axis_filters": state.axis_filters(choices.degrees), "mesh_of": stored_mesh,
        "notices": notices,
        "any_plans": total > 0
        or (state.filtered and queries.count_plans(session, plan_listing.PlanFilters()) > 0),
    })


def _form_context(request: Request, session: SessionDep, form: plan_form.PlanForm) -> dict[str, object]:
    return {
        "active": "new", "form": form,
        "models": plan_form.model_choices(), "gpus": plan_form.gpu_choices(),
        "domain_defaults": plan_form.domain_defaults(),
        "precisions": typing.get_args(Precision), "optimizers": typing.get_args(Optimizer),
        "state_dtypes": typing.get_args(StateDType),
        "calibrations": [
            (row.id, row.name, calibration_views.hardware_label(row.fingerprint))
            for row in queries.calibration_choices(session)
        ],
        "key_required": access.write_key_required(session, request),
    }


@router.get("/plans/new", response_class=HTMLResponse)
def new_plan_page(request: Request, session: SessionDep) -> HTMLResponse:
    # Query parameters prefill the form ("plan again with changes" links from a plan's page).
    form = plan_form.PlanForm.from_values(request.query_params)
    return render(request, "plan_new.html", _form_context(request, session, form))


@router.post("/plans/new", response_class=HTMLResponse)
async def create_plan_from_form(request: Request, session: SessionDep, settings: SettingsDep) -> Response:
    submitted = await request.form()
    form = plan_form.PlanForm.from_values(submitted)
    raw_key = submitted.get("api_key")
    api_key = raw_key if isinstance(raw_key, str) else ""
    # Which client's share the search takes (a key's, else the address's); the form itself says what is
    # wrong with the key (`_answer_form`).
    await run_in_threadpool(_form_key_error, session, request, api_key)
    try:
        async with search_share(request):  # the search takes one of this client's share of the pool
            return await run_planning(
                request, _create_plan, request, session, settings.max_model_layers, form, api_key,
            )
    except ProblemError as problem:  # the share stayed full (429): a page, not the API's JSON
        return error_page(request, problem.status_code, problem.detail, headers=problem.headers)


@router.post("/plans/new/batch-hint", response_class=PlainTextResponse)
async def batch_hint(request: Request, session: SessionDep, settings: SettingsDep) -> PlainTextResponse:
    """The form's line under the batch, for the page's script: the planner's own batch advice, priced
    in the search pool under its deadline (it probes configurations; a planning thread waits for it),
    so that the hint and the refusal agree. It searches, so it needs what a submission needs: the API
    key once keys exist (401 without; the script then keeps its arithmetic), and room in the client's
    share of the search pool (429)."""
    submitted = await request.form()
    form = plan_form.PlanForm.from_values(submitted)
    api_key = submitted.get("api_key")
    key_error = await run_in_threadpool(
        _form_key_error, session, request, api_key if isinstance(api_key, str) else ""
    )
    if key_error:
        return PlainTextResponse(key_error, status_code=401)
    hint = functools.partial(plan_form.batch_hint_for, max_model_layers=settings.max_model_layers,
                             search_pool=request.app.state.search_pool)
    async with search_share(request):
        text = await run_planning(request, hint, form, session)
    return PlainTextResponse(text)


def _form_key_error(session: SessionDep, request: Request, api_key: str) -> str | None:
    """`access.write_key_error`; a valid key the browser signed in with or typed into the form names the
    client whose share of the search pool the search takes (`search_share`). The pooled connection is
    handed back before the search waits (api/deps.py)."""
    try:
        for key in (access.basic_auth_key(request), api_key.strip()):
            row = keys.verify_key(session, key) if key else None
            if row is not None:
                request.state.api_key_id = row.id
                return None
        return access.write_key_error(session, request, api_key)
    finally:
        session.commit()


def _create_plan(
    request: Request, session: SessionDep, max_model_layers: int, form: plan_form.PlanForm, api_key: str
) -> Response:
    def create(body: Any) -> str:
        units = plan_job_service.units_of(body)
        if units is not None and units > request.app.state.settings.job_threshold_units:
            submission = plan_job_service.submit_plan(
                session, body, locks=request.app.state.plan_locks, max_model_layers=max_model_layers,
                search_pool=request.app.state.search_pool,
                enqueue=request.app.state.plan_jobs.enqueue,
            )
            if submission is not None:  # a search as a job: its page follows it to the plan
                request.app.state.plan_jobs.submit(submission.job_id)
                return f"/plan-jobs/{submission.job_id}"
        outcome = plan_service.create_plan(
            session, body, locks=request.app.state.plan_locks, search_pool=request.app.state.search_pool,
            max_model_layers=max_model_layers,
        )
        return f"/plans/{outcome.row.id}" + ("?existing=1" if outcome.status_code == 200 else "")

    return _answer_form(request, session, form, api_key, build=plan_form.to_plan_create, create=create,
                        add_problem=plan_form.add_problem, page="plan_new.html", context=_form_context)


def _answer_form(
    request: Request, session: SessionDep, form: Any, api_key: str, *, build: Callable[[Any], Any],
    create: Callable[[Any], str], add_problem: Callable[[Any, ProblemError], None], page: str,
    context: Callable[[Request, SessionDep, Any], dict[str, object]],
) -> Response:
    """A submitted form: created (303 to `create`'s page), or shown again with every error beside its
    field (401 when only the API key is missing or wrong, 422 otherwise)."""
    key_error = access.write_key_error(session, request, api_key)
    if key_error:
        form.add_error("api_key", key_error)
    body = build(form)
    if body is not None and not form.errors:
        try:
            return RedirectResponse(create(body), status_code=303)
        except ProblemError as problem:
            add_problem(form, problem)
    session.commit()
    status = 401 if set(form.errors) == {"api_key"} else 422
    return render(request, page, context(request, session, form), status_code=status)


@router.get("/plans/{plan_id}", response_class=HTMLResponse)
def plan_page(plan_id: str, request: Request, session: SessionDep) -> HTMLResponse:
    row = queries.plan_with_documents(session, _parse_id(plan_id, "plan"))
    if row is None:
        raise StarletteHTTPException(404, f"Plan {plan_id} does not exist (it may have been deleted).")
    try:
        plan = read_plan(row)
    except UnreadablePlanError as exc:
        return error_page(request, 500, str(exc))
    runs = queries.validation_runs(session, row.id)
    replan = {
        "num_nodes": plan.cluster.num_nodes, "gpus_per_node": plan.cluster.gpus_per_node,
        "gpu": plan.cluster.gpu, "seq_len": plan.training.seq_len,
        "global_batch_tokens": plan.training.global_batch_tokens, "precision": plan.training.precision,
        "optimizer": plan.training.optimizer, "calibration_id": row.calibration_id or "",
    }
    if plan.cluster.scaleup_domain_gpus is not None:  # a domain the request stated, not the GPU's own
        replan["scaleup_domain_gpus"] = plan.cluster.scaleup_domain_gpus
    if plan.training.state_dtype == "bfloat16":  # mixed precision's links read as before
        replan["state_dtype"] = plan.training.state_dtype
    if plan.model.name in MODEL_CATALOG:
        replan["model"] = plan.model.name
    search = row.request.get("search") or {}
    for entry in searched_axes():  # each mesh axis's pin (contract/mesh.py's registry)
        pinned = search.get(entry.search_field)
        if entry.form_field and isinstance(pinned, list) and len(pinned) == 1:
            replan[entry.form_field] = pinned[0]  # the form pins one degree; keep the pin
    return render(request, "plan_detail.html", {
        "active": "plans", "row": row, "plan": plan, "existing": request.query_params.get("existing") == "1",
        "inputs": plan_views.input_rows(row, plan), "config": plan_views.config_rows(plan.config),
        "prediction": plan_views.prediction_rows(plan),
        "memory_chart": plan_views.memory_chart([(row.name, plan)]),
        "expert_memory": plan_views.expert_memory_rows(plan),
        "timeline_chart": plan_views.timeline_chart(plan) if plan.prediction.timeline else None,
        "timeline_per_phase": plan_views.timeline_per_phase(plan),
        "pipeline": pipeline_views.section(plan),
        "tradeoff_chart": plan_views.tradeoff_chart(plan),
        "candidates": plan_views.candidate_rows(plan), "rejected": summarize_rejected(plan), "runs": runs,
        "studies": queries.studies_of_plan(session, row.id),
        "launcher_targets": LAUNCHER_TARGETS,
        "torchtitan_refused": _torchtitan_refused(plan),
        "replan_query": replan,
        "key_required": access.write_key_required(session, request),
    })


@router.post("/plans/{plan_id}/replan", response_class=HTMLResponse)
async def replan_from_form(plan_id: str, request: Request, session: SessionDep) -> Response:
    """The OOM row's button: the same as POST /api/v1/plans/{id}/replan, then the new plan's page."""
    submitted = await request.form()
    run_id, api_key = submitted.get("run_id"), submitted.get("api_key")
    return await run_in_threadpool(
        _replan, request, session, _parse_id(plan_id, "plan"),
        run_id if isinstance(run_id, str) else "", api_key if isinstance(api_key, str) else "",
    )


def _replan(request: Request, session: SessionDep, plan_id: int, run_id: str, api_key: str) -> Response:
    key_error = access.write_key_error(session, request, api_key)
    if key_error:
        return error_page(request, 401, key_error)
    parsed_run_id = parse_id(run_id) if run_id else None
    if run_id and parsed_run_id is None:
        return error_page(request, 422, f"run_id {run_id[:40]!r} is not a run id: ids are whole numbers "
                          f"from 1 to {MAX_ID}.")
    try:
        body = ReplanCreate(run_id=parsed_run_id)
        submission = plan_job_service.submit_replan(
            session, plan_id, body, locks=request.app.state.plan_locks,
            enqueue=request.app.state.plan_jobs.enqueue,
        )
    except ProblemError as problem:
        session.commit()
        return error_page(request, problem.status_code, problem.detail)
    # A re-plan is a job: its page follows it, then leads to the plan.
    request.app.state.plan_jobs.submit(submission.job_id)
    return RedirectResponse(f"/plan-jobs/{submission.job_id}", status_code=303)


@router.get("/plan-jobs/{job_id}", response_class=HTMLResponse)
def plan_job_page(job_id: str, request: Request, session: SessionDep) -> Response:
    """A re-plan (or a large plan search) while it runs: its state, polled by dashboard.js; once it has
    succeeded, the plan's page (a redirect); once it has failed, why."""
    try:
        job = plan_job_service.get_job(session, _parse_id(job_id, "plan job"))
    except ProblemError:
        raise StarletteHTTPException(404, f"Plan job {job_id} does not exist.") from None
    if job.state == "succeeded" and job.plan_id is not None:
        suffix = "?existing=1" if job.status_code == 200 else ""
        return RedirectResponse(f"/plans/{job.plan_id}{suffix}", status_code=303)
    return render(request, "plan_job.html", {"active": "plans", "job": job})


@router.get("/compare", response_class=HTMLResponse)
def compare_page(request: Request, session: SessionDep) -> HTMLResponse:
    try:
        ids = plan_compare.parse_ids(request.query_params.getlist("ids"))
    except plan_compare.CompareIdsError as exc:
        raise StarletteHTTPException(404, f"There is no plan to compare: {exc}.") from None
    try:
        plan_compare.check_count(ids)
    except plan_compare.CompareIdsError:
        return render(request, "compare.html", {
            "active": "compare", "ids": ids, "max_compared": plan_compare.MAX_COMPARED, "plans": [],
            "rows": [],
        }, status_code=200 if not ids else 400)
    try:
        plans = plan_compare.load_plans(session, ids)
    except plan_compare.MissingPlansError as exc:
        raise StarletteHTTPException(404, f"{str(exc).capitalize()}.") from None
    except UnreadablePlanError as exc:
        return error_page(request, 500, str(exc))
    return render(request, "compare.html", {
        "active": "compare", "ids": ids, "max_compared": plan_compare.MAX_COMPARED, "plans": plans,
        "rows": plan_views.compare_rows(plans),
        "memory_chart": plan_views.memory_chart([(f"#{r.id} {r.name}", p) for r, p in plans]),
    })


@router.get("/calibrations", response_class=HTMLResponse)
def calibrations_page(request: Request, session: SessionDep) -> HTMLResponse:
    # Bounded so that the page's row offset stays an id-sized number (SQL offsets are 64-bit).
    page = parse_whole(request.query_params.get("page", "1"), low=1,
                       high=MAX_ID // queries.CALIBRATIONS_PER_PAGE) or 1
    rows, total = queries.calibration_page(session, page)
    pages = max(1, -(-total // queries.CALIBRATIONS_PER_PAGE))
    return render(request, "calibrations.html", {
        "active": "calibrations", "rows": rows, "total": total, "page": page, "pages": pages,
        "hardware_label": calibration_views.hardware_label,
    })


@router.get("/calibrations/{calibration_id}", response_class=HTMLResponse)
def calibration_page(calibration_id: str, request: Request, session: SessionDep) -> HTMLResponse:
    row = queries.calibration_with_profile(session, _parse_id(calibration_id, "calibration profile"))
    if row is None:
        raise StarletteHTTPException(404, f"Calibration profile {calibration_id} does not exist.")
    try:
        profile = calibration_views.read_profile(row)
    except calibration_views.UnreadableProfileError as exc:
        return error_page(request, 500, str(exc))
    return render(request, "calibration_detail.html", {
        "active": "calibrations", "row": row, "profile": profile,
        "fingerprint": calibration_views.fingerprint_rows(profile),
        "matmul_chart": calibration_views.matmul_chart(profile, row.fitted_parameters),
        "collective_chart": calibration_views.collective_chart(profile),
        "fitted": calibration_views.fitted_table(profile, row.fitted_parameters),
        "plans": queries.plans_using_calibration(session, row.id),
        "best_memory_bandwidth": max((s.bytes / s.seconds for s in profile.memory_bandwidth), default=None),
    })


@router.get("/accuracy", response_class=HTMLResponse)
def accuracy_page(request: Request, session: SessionDep) -> HTMLResponse:
    runs, total = queries.all_validation_runs(session)
    fidelity = served_report()
    return render(request, "accuracy.html", {
        "active": "accuracy", "runs": runs, "total": total, "shown": len(runs),
        "summaries": accuracy_views.summaries(runs),
        "step_time_chart": accuracy_views.step_time_chart(runs),
        "memory_chart": accuracy_views.memory_chart(runs),
        "error_histogram": accuracy_views.error_histogram(runs),
        "fidelity": fidelity,
        "corpus_chart": accuracy_views.corpus_throughput_chart(fidelity),
        "corpus_unplotted": accuracy_views.corpus_speed_unpriced(fidelity),
        "corpus_runs": accuracy_views.corpus_runs(fidelity),
    })


@router.get("/studies", response_class=HTMLResponse)
def studies_page(request: Request, session: SessionDep) -> HTMLResponse:
    # The cursor is the last id shown; a malformed one (an edited link) starts from the newest.
    rows, next_cursor = study_service.list_studies(
        session, limit=STUDIES_PER_PAGE, cursor=parse_id(request.query_params.get("cursor", ""))
    )
    return render(request, "studies.html", {
        "active": "studies", "rows": rows,
        "next_href": f"/studies?cursor={next_cursor}" if next_cursor else None,
    })


def _study_form_context(
    request: Request, session: SessionDep, form: study_form.StudyForm
) -> dict[str, object]:
    return {
        "active": "studies", "form": form, "models": plan_form.model_choices(),
        "gpus": plan_form.gpu_choices(), "precisions": typing.get_args(Precision),
        "key_required": access.write_key_required(session, request),
    }


@router.get("/studies/new", response_class=HTMLResponse)
def new_study_page(request: Request, session: SessionDep) -> HTMLResponse:
    return render(request, "study_new.html", _study_form_context(request, session, study_form.StudyForm()))


@router.post("/studies/new", response_class=HTMLResponse)
async def create_study_from_form(request: Request, session: SessionDep, settings: SettingsDep) -> Response:
    submitted = await request.form()
    form = study_form.StudyForm.from_submission(submitted)
    api_key = submitted.get("api_key")
    return await run_planning(
        request, _create_study, request, session, settings.max_model_layers, form,
        api_key if isinstance(api_key, str) else "",
    )


def _create_study(
    request: Request, session: SessionDep, max_model_layers: int, form: study_form.StudyForm, api_key: str
) -> Response:
    def create(body: Any) -> str:
        # Queued, not planned: the study page follows its job (a progress bar) from the first moment.
        submission = study_service.submit_study(
            session, body, locks=request.app.state.plan_locks, max_model_layers=max_model_layers,
        )
        request.app.state.jobs.submit(submission.study_id)
        return f"/studies/{submission.study_id}"

    return _answer_form(request, session, form, api_key, build=study_form.to_study_create, create=create,
                        add_problem=study_form.add_problem, page="study_new.html",
                        context=_study_form_context)


@router.get("/studies/{study_id}", response_class=HTMLResponse)
def study_page(study_id: str, request: Request, session: SessionDep) -> HTMLResponse:
    try:
        study = study_service.get_study(session, _parse_id(study_id, "study"))
    except ProblemError:
        message = f"Study {study_id} does not exist (it may have been deleted)."
        raise StarletteHTTPException(404, message) from None
    return render(request, "study_detail.html", {
        "active": "studies", "study": study, "picks": study_views.picks(study),
        "key_required": access.write_key_required(session, request),
        "fitting": study_views.fitting_by_cost(study), "refused": [p for p in study.points if not p.fits],
        "marks": study_views.marks, "inputs": study_views.input_rows(study),
        "chart": study_views.chart(study),
    })


@router.post("/studies/{study_id}/cancel", response_class=HTMLResponse)
async def cancel_study_from_form(study_id: str, request: Request, session: SessionDep) -> Response:
    submitted = await request.form()
    api_key = submitted.get("api_key")
    return await run_in_threadpool(_cancel_study, request, session, _parse_id(study_id, "study"),
                                   api_key if isinstance(api_key, str) else "")


def _cancel_study(request: Request, session: SessionDep, study_id: int, api_key: str) -> Response:
    key_error = access.write_key_error(session, request, api_key)
    if key_error:
        session.commit()
        return error_page(request, 401, key_error)
    try:
        study_service.cancel_study(session, study_id)
    except ProblemError as problem:
        if problem.status == 404:
            message = f"Study {study_id} does not exist (it may have been deleted)."
            raise StarletteHTTPException(404, message) from None
        # Finished meanwhile: its page shows the outcome.
    return RedirectResponse(f"/studies/{study_id}", status_code=303)
