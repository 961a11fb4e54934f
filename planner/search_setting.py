"""What a search holds fixed: the priced model and the (calibrated) cost parameters of one request.

Its own module because the search and the pre-check's advice (planner/precheck.py) both price
requests with it, and the advice runs before the search.
"""

from __future__ import annotations

from planner.calibration import CalibrationProfile, fit_parameters
from planner.cost.model_costs import model_costs
from planner.cost.parameters import CostParameters, default_parameters
from planner.cost.setting import Setting
from planner.specs import PlanRequest


def build_setting(
    request: PlanRequest, calibration: CalibrationProfile | None = None, calibration_id: str | None = None
) -> Setting:
    """What the search holds fixed: the priced model and the (calibrated) cost parameters."""
    cluster = request.cluster
    gpu = cluster.resolved_gpu()
    params: CostParameters = default_parameters(gpu, cluster, request.training.precision)
    if calibration is not None:
        params = fit_parameters(
            calibration,
            base=params,
            precision=request.training.precision,
            optimizer=request.training.optimizer,
        )
        # A calibrated plan must never share its hash with an uncalibrated one: name the profile by
        # its content when the caller gives no id.
        calibration_id = calibration_id or calibration.content_id()
    if calibration_id is not None:
        params = params.with_changes(calibration_id=calibration_id)
    return Setting(
        model=model_costs(request.model, request.training.seq_len),
        params=params,
        precision=request.training.precision,
        optimizer=request.training.optimizer,
        world_size=cluster.world_size,
        gpus_per_node=cluster.gpus_per_node,
        num_nodes=cluster.num_nodes,
        seq_len=request.training.seq_len,
        global_batch_sequences=request.training.global_batch_sequences,
        state_dtype=request.training.state_dtype,
        scaleup_gpus=cluster.scaleup_gpus,
    )
