"""HTTP endpoints, one router per domain, all mounted under /api/v1 by `api.app.create_app`."""

from fastapi import APIRouter

from api.routers import calibrations, catalog, fidelity, health, launchers, plan_jobs, plans, runs, studies

api_router = APIRouter()
api_router.include_router(plans.router)
api_router.include_router(studies.router)
api_router.include_router(plan_jobs.router)
api_router.include_router(runs.router)
api_router.include_router(launchers.router)
api_router.include_router(calibrations.router)
api_router.include_router(catalog.router)
api_router.include_router(fidelity.router)
api_router.include_router(health.router)
