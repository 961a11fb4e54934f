"""/models and /gpus: what the planner knows without being told."""

from __future__ import annotations

from fastapi import APIRouter

from api.deps import ReadAccess
from api.routers.responses import problems
from api.schemas.catalog import GpuInfo, ModelInfo
from planner.catalog.gpus import GPU_CATALOG
from planner.catalog.models import MODEL_CATALOG
from planner.cost.model_costs import count_parameters, model_costs

router = APIRouter(tags=["catalog"], dependencies=[ReadAccess], responses=problems(401))

# The catalogs are constants: build the responses once.
_MODELS = [
    ModelInfo(
        name=spec.name, architecture=spec.architecture, num_params=count_parameters(spec),
        active_params=model_costs(spec, 1).active_params, vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size, num_layers=spec.num_layers,
        num_heads=spec.num_heads, num_kv_heads=spec.kv_heads, intermediate_size=spec.ffn_size,
        max_seq_len=spec.max_seq_len,
    )
    for spec in MODEL_CATALOG.values()
]
_GPUS = [GpuInfo.model_validate(gpu.model_dump()) for gpu in GPU_CATALOG.values()]


@router.get("/models", response_model=list[ModelInfo], summary="Models known by name")
def list_models() -> list[ModelInfo]:
    return _MODELS


@router.get("/gpus", response_model=list[GpuInfo], summary="GPUs known by name or alias")
def list_gpus() -> list[GpuInfo]:
    return _GPUS
