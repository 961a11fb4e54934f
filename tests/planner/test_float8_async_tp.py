"""Float8 training and async tensor parallelism in the planner: what converts, what it costs, where
it is refused."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from contract.float8 import float8_converts
from contract.mesh import Mesh
from planner.cost.estimate import Estimator, async_tensor_parallel_seconds, async_tensor_parallel_step
from planner.cost.layout import comm_layout
from planner.cost.model_costs import float8_share, tensor_parallel_share
from planner.cost.setting import Choice
from planner.errors import PlanningError
from planner.search import make_plan, predict
from planner.search_setting import build_setting
from planner.specs import PlanRequest, SearchSpace, TrainingSpec
from tests.planner.conftest import make_request

RECIPES = ["none", "tensorwise", "rowwise"]


@pytest.mark.parametrize(
    ("recipe", "in_features", "out_features", "converts"),
    [
        # torchao's auto filters, stated in contract/float8.py (shapes as nn.Linear(in, out)).
        ("tensorwise", 4096, 14336, True),
        ("tensorwise", 4096, 1024, False),  # llama3-8b's k/v: too small, the casts cost more than gained
        ("tensorwise", 8192, 1024, True),  # llama3-70b's k/v
        ("tensorwise", 4104, 4096, False),  # not a multiple of 16
        ("rowwise", 4096, 2048, False),  # rowwise needs out > 2048
        ("rowwise", 1024, 8192, False),  # and in > 1024
        ("rowwise", 2048, 4096, False),  # and not both out <= 4096 and in <= 2048
        ("rowwise", 4096, 4096, True),
        ("mxfp8", 4112, 4112, False),  # MX needs multiples of 32
        ("none", 8192, 8192, False),
    ],
)
def test_the_float8_filter_is_torchaos(
    recipe: str, in_features: int, out_features: int, converts: bool
) -> None:
    assert float8_converts(recipe, in_features, out_features) is converts


def _estimate(request: PlanRequest, **choice) -> tuple[float, float]:
    setting = build_setting(request, None, None)
    estimator = Estimator(setting)
    picked = Choice(sharding="full_shard", mesh=make_plan(request).config.mesh, compile=True, **choice)
    return estimator.timing(picked).step_time_s, estimator.memory(picked).total


def test_float8_speed_ups_on_an_h100_are_those_torchao_measured() -> None:
    request = make_request("llama3-8b", "1x8xH100", seq_len=8192, sequences=8)
    times = {recipe: _estimate(request, float8=recipe)[0] for recipe in RECIPES}
    # torchao's 8B runs on 8 H100 (planner/fidelity/corpus): tensorwise 1.25x bf16's throughput,
    # rowwise 1.1x; its slower scaled GEMMs barely pay for their casts at 8B's shapes.
    assert 1.1 < times["none"] / times["tensorwise"] < 1.4
    assert 0.85 < times["none"] / times["rowwise"] < 1.15
    assert times["tensorwise"] < times["rowwise"]


def test_a_model_too_small_to_convert_prices_as_bf16() -> None:
    request = make_request("llama-debug", "1x8xH100", seq_len=512, sequences=8)
    setting = build_setting(request, None, None)
    assert float8_share(setting.model.blocks[0], "tensorwise").matmul_fraction == 0.0
    assert _estimate(request, float8="tensorwise") == _estimate(request, float8="none")


def test_fsdp2_gathers_tensorwise_weights_in_one_byte() -> None:
    request = make_request("llama3-8b", "1x8xH100", seq_len=8192, sequences=8)
    setting = build_setting(request, None, None)
    bf16 = comm_layout(setting, Choice(sharding="full_shard"))
    fp8 = comm_layout(setting, Choice(sharding="full_shard", float8="tensorwise"))
    rowwise = comm_layout(setting, Choice(sharding="full_shard", float8="rowwise"))
    block = setting.model.blocks[0]
    saved = float8_share(block, "tensorwise").params  # 2 bytes -> 1 byte per converted weight
    kv = 4096 * 1024  # k and v stay in bf16: torchao's filter finds them too small
    assert saved == block.matmul_params - 2 * kv
    saved_in_all = saved * len(setting.model.blocks)
    assert bf16.model_gather_bytes - fp8.model_gather_bytes == pytest.approx(saved_in_all)
    assert rowwise.model_gather_bytes == bf16.model_gather_bytes  # only tensorwise scales survive sharding
    # Compiled SimpleFSDP gathers DTensors without FSDP2's hooks: in bf16, cast after the gather.
    compiled = comm_layout(setting, Choice(sharding="full_shard", compile=True, float8="tensorwise"))
    compiled_bf16 = comm_layout(setting, Choice(sharding="full_shard", compile=True))
    assert compiled.model_gather_bytes == compiled_bf16.model_gather_bytes


def test_the_search_tries_float8_only_when_asked_and_says_why_bf16_lost() -> None:
    request = make_request("llama3-8b", "1x8xH100", seq_len=8192, sequences=8)
    assert make_plan(request).config.float8 == "none"
    asked = make_request("llama3-8b", "1x8xH100", seq_len=8192, sequences=8,
                         search=SearchSpace(float8=["none", "tensorwise"], compile=[True]))
    plan = make_plan(asked)
    assert plan.config.float8 == "tensorwise" and "fp8-tensorwise" in plan.config.label()
    # A fixed configuration prices the same as the search did.
    again = predict(asked, plan.config)
    assert again.prediction.step_time_s == pytest.approx(plan.prediction.step_time_s)
    bf16 = predict(asked, replace(plan.config, float8="none"))
    assert bf16.prediction.tokens_per_s_per_gpu < plan.prediction.tokens_per_s_per_gpu


@pytest.mark.parametrize(
    ("cluster", "recipes", "precision", "message"),
    [
        ("1x8xA100", ["tensorwise"], "bf16", "search.float8: tensorwise: the A100-80GB has no float8"),
        ("1x8xL4", ["rowwise"], "bf16", "the L4 has no float8 tensor cores"),
        ("1x8xH100", ["mxfp8"], "bf16", "mxfp8: needs MX tensor cores (Blackwell: B200, B300, GB200, GB300), "
         "the H100-SXM-80GB has none"),
        ("1x8xH100", ["tensorwise"], "fp32", "set training.precision to bf16"),
    ],
)
def test_float8_is_refused_where_it_cannot_run(
    cluster: str, recipes: list, precision: str, message: str
) -> None:
    search = SearchSpace(float8=recipes)
    request = make_request("llama3-8b", cluster, seq_len=4096, sequences=8, search=search)
    request = request.model_copy(update={"training": TrainingSpec(
        seq_len=4096, global_batch_tokens=4096 * 8, precision=precision)})
    with pytest.raises(PlanningError, match=re.escape(message)) as err:
        make_plan(request)
    assert err.value.field == "search.float8"


def test_a_fixed_float8_configuration_is_refused_on_a_gpu_without_float8() -> None:
    h100 = make_request("llama3-8b", "1x8xH100", seq_len=4096, sequences=8,
                        search=SearchSpace(float8=["tensorwise"]))
    config = make_plan(h100).config
    a100 = make_request("llama3-8b", "1x8xA100", seq_len=4096, sequences=8)
    with pytest.raises(PlanningError, match=re.escape("config.float8: tensorwise: the A100-80GB has no")):
        predict(a100, config)


def test_mxfp8_prices_on_a_b200() -> None:
    request = make_request("llama3-8b", "1x8xB200", seq_len=8192, sequences=8,
                           search=SearchSpace(float8=["none", "mxfp8"], compile=[True]))
    assert make_plan(request).config.float8 == "mxfp8"


def test_requests_without_float8_hash_as_before_it_existed() -> None:
    assert "float8" not in SearchSpace().model_dump(mode="json")
    asked = SearchSpace(float8=["none", "tensorwise"])
    assert asked.model_dump(mode="json")["float8"] == ["none", "tensorwise"]


# ---------------------------------------------------------------- async tensor parallelism


def test_async_tp_exposes_the_first_piece_and_what_outlasts_the_matmuls() -> None:
    # 8 pieces: the first of 10 ms waits (1.25 ms); the other 8.75 ms hide behind 40 ms of matmuls,
    # which they slow by the contention (25%).
    assert async_tensor_parallel_seconds(0.010, 0.040, tp=8, contention=0.25) == pytest.approx(
        0.00125 + 0.25 * 0.00875
    )
    # Matmuls shorter than the transfer: the excess is exposed too.
    assert async_tensor_parallel_seconds(0.010, 0.004, tp=2, contention=0.0) == pytest.approx(
        0.005 + (0.005 - 0.002)
    )


def test_async_tp_leaves_the_backward_reduce_scatters_of_summed_gradients_exposed() -> None:
    # A llama block's forward all-gathers 2 of its 4 tensor-parallel collectives' elements (before q/k/v
    # and before the MLP's gate/up); backward reduce-scatters their gradients, each the sum of several
    # matmuls' outputs, which inductor's micro-pipelining does not fuse: half the backward stays as is.
    request = make_request("llama3-8b", "1x8xH100", seq_len=8192, sequences=8)
    block = tensor_parallel_share(build_setting(request, None, None).model, 8).blocks[0]
    assert block.gathered_elems / block.tp_collective_elems == pytest.approx(0.5)
    forward, backward = async_tensor_parallel_step(0.010, 0.040, unit=block, tp=8, contention=0.25)
    pipelined = async_tensor_parallel_seconds(0.010, 0.040, tp=8, contention=0.25)
    assert forward == pytest.approx(pipelined)
    assert backward == pytest.approx(0.5 * pipelined + 0.5 * 0.010)


def test_async_tp_is_searched_when_asked_for_compiled_tp_plans() -> None:
    pinned = SearchSpace(tensor_parallel_degrees=[8], compile=[True])
    request = make_request("llama3-70b", "32x8xH100", seq_len=8192, sequences=256, search=pinned)
    vanilla = make_plan(request)
    asked = make_plan(request.model_copy(update={"search": pinned.model_copy(update={"async_tp": True})}))
    assert not vanilla.config.async_tp and asked.config.async_tp
    assert "async-tp" in asked.config.label()
    # torchtitan's 70B on 256 H100 (FSDP 32 x TP 8) gained 1.09x from async TP in bf16.
    gain = asked.prediction.tokens_per_s_per_gpu / vanilla.prediction.tokens_per_s_per_gpu
    assert 1.03 < gain < 1.25
    assert asked.prediction.exposed_tensor_parallel_s < vanilla.prediction.exposed_tensor_parallel_s
    assert "async_tp" not in SearchSpace().model_dump(mode="json")  # requests hash as before


def test_async_tp_is_refused_where_it_cannot_run() -> None:
    cpu = make_request("llama-debug", "1x2xcpu", seq_len=64, sequences=4, search=SearchSpace(async_tp=True))
    refusal = re.escape("search.async_tp: async TP needs CUDA symmetric memory")
    with pytest.raises(PlanningError, match=refusal):
        make_plan(cpu)
    h100 = make_request("llama3-70b", "32x8xH100", seq_len=8192, sequences=256,
                        search=SearchSpace(tensor_parallel_degrees=[8], compile=[False]))
    eager = make_plan(h100).config
    with pytest.raises(PlanningError, match=r"config\.async_tp: .* it needs compile and mesh\.tp > 1"):
        predict(h100, replace(eager, async_tp=True))


def test_tensor_parallel_ranks_cast_the_gathered_sequence_whole_unless_float8_styles_cast_shards() -> None:
    request = make_request("llama3-8b", "1x8xH100", seq_len=8192, sequences=8)
    block = tensor_parallel_share(build_setting(request, None, None).model, 8).blocks[0]
    shards = float8_share(block, "rowwise", compiled=True)
    whole = float8_share(block, "rowwise", compiled=True, whole_sequence_casts=True)
    # Gathered whole on every rank: q/k/v's and w1/w3's input (cast once each, compiled) and wo's and
    # w2's output gradient, h elements a token each, cast twice (the transposed copy for backward):
    # the rank casts them whole where a sharded cast would be 1/8 of them.
    h = 4096
    assert whole.cast_elems - shards.cast_elems == pytest.approx(2 * 4 * h * (1 - 1 / 8))
    assert whole.matmul_fraction == shards.matmul_fraction and whole.params == shards.params
    tp8 = Mesh(dp_shard=1, tp=8)
    # torchtitan's tensorwise recipe casts shards before gathering them (torchao's float8 styles);
    # its rowwise recipes and this project's runtime cast what torch's styles gathered.
    def whole_casts(**fields: str) -> bool:
        return Choice(sharding="full_shard", mesh=tp8, **fields).float8_casts_whole_sequence

    assert not whole_casts(float8="tensorwise", engine="torchtitan")
    assert whole_casts(float8="rowwise", engine="torchtitan")
    assert whole_casts(float8="tensorwise")
    assert not Choice(sharding="full_shard", float8="rowwise").float8_casts_whole_sequence
