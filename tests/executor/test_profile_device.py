"""The profiler's device detection on CUDA and ROCm builds of torch (issue 43, item 3), tested on CPU by
standing in for the device queries: a ROCm build reports its HIP version and no CUDA one, an Instinct
GPU is named from its device name or, where that is blank, from its architecture and memory; float8
GEMMs take the fnuz encoding on MI300-series GPUs and are not timed where none exists; the names the
profiler gives are the catalog's, and the planner reads a ROCm profile."""

from __future__ import annotations

import hashlib
from types import SimpleNamespace

import pytest
import torch

from executor.profile import device as detect
from executor.profile import measure
from planner.calibration import CalibrationProfile
from planner.catalog.gpus import resolve_gpu

GIB = 2**30
GPU = torch.device("cuda", 0)


@pytest.fixture
def rocm(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """A ROCm build of torch with one device, whose name, architecture and memory a test sets."""
    device = SimpleNamespace(name="AMD Instinct MI300X", arch="gfx942:sramecc+:xnack-", memory=192)
    monkeypatch.setattr(torch.version, "hip", "7.2.41134-abc", raising=False)
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda _=None: device.name)
    monkeypatch.setattr(
        torch.cuda,
        "get_device_properties",
        lambda _=None: SimpleNamespace(gcnArchName=device.arch, total_memory=device.memory * 10**9),
    )
    return device


def test_every_name_the_profiler_gives_is_the_catalogs() -> None:
    names = [gpu for _, gpu in detect.KNOWN_GPUS]
    names += [gpu for sizes in detect.AMD_ARCHITECTURES.values() for _, gpu in sizes]
    assert all(resolve_gpu(name).name == name for name in names)


@pytest.mark.parametrize(
    ("reported", "gpu"),
    [
        ("NVIDIA H100 80GB HBM3", "H100-SXM-80GB"),
        ("NVIDIA L40S", "L40S"),  # a word, not a prefix: no L4
        ("NVIDIA GB200", "GB200"),  # no B200
        ("NVIDIA B300 SXM6 AC", "B300"),
        ("NVIDIA H20", "H20"),
        ("NVIDIA RTX 6000 Ada Generation", None),
    ],
)
def test_nvidia_devices_are_named_by_a_whole_word(
    reported: str, gpu: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda _=None: reported)
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    assert detect.catalog_gpu(GPU) == gpu
    assert detect.catalog_gpu(torch.device("cpu")) == "cpu"


def test_a_rocm_build_reports_hip_and_names_instinct_gpus(rocm: SimpleNamespace) -> None:
    assert detect.is_rocm()
    assert detect.runtime_versions() == {"cuda_version": None, "hip_version": "7.2.41134-abc"}
    assert detect.architecture(GPU) == "gfx942" and detect.catalog_gpu(GPU) == "MI300X"
    # A virtual function or an OEM name: the architecture and the memory tell the GPU.
    rocm.name = ""
    assert detect.catalog_gpu(GPU) == "MI300X"
    rocm.memory = 256
    assert detect.catalog_gpu(GPU) == "MI325X"
    rocm.arch, rocm.memory = "gfx950:sramecc+:xnack-", 288
    assert detect.catalog_gpu(GPU) == "MI355X"
    rocm.arch = "gfx90a:sramecc+:xnack-"  # MI250X: no catalog entry
    assert detect.catalog_gpu(GPU) is None


def test_the_allocator_recorded_is_the_one_the_build_reads(
    rocm: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    monkeypatch.delenv("PYTORCH_HIP_ALLOC_CONF", raising=False)
    assert detect.allocator_config() == "expandable_segments:True"
    monkeypatch.setenv("PYTORCH_HIP_ALLOC_CONF", "")  # set, though empty: the HIP allocator's defaults
    assert detect.allocator_config() == ""
    monkeypatch.setattr(torch.version, "hip", None, raising=False)  # a CUDA build ignores the HIP name
    assert detect.allocator_config() == "expandable_segments:True"


def test_float8_gemms_take_each_architectures_encoding(rocm: SimpleNamespace) -> None:
    assert detect.float8_gemm_dtype(GPU) == torch.float8_e4m3fnuz  # MI300X, MI325X
    rocm.arch = "gfx950"
    assert detect.float8_gemm_dtype(GPU) == torch.float8_e4m3fn  # MI355X: OCP e4m3
    rocm.arch = "gfx90a"  # MI250X reads as capability 9.0, but has no float8 GEMM
    assert detect.float8_gemm_dtype(GPU) is None
    assert measure.float8_matmul_samples([(64, 64, 64)], GPU, measure.Budget(10.0)) == []
    assert detect.float8_gemm_dtype(torch.device("cpu")) is None


def test_the_planner_reads_a_rocm_profile() -> None:
    fingerprint = {
        "device_name": "AMD Instinct MI300X", "device_count": 8, "gpus_per_node": 8, "backend": "nccl",
        "torch_version": "2.13.0+rocm7.2", "cuda_version": None, "hip_version": "7.2.41134",
        "nccl_version": "2.27.3",
    }
    sample = {"m": 8192, "n": 8192, "k": 8192, "seconds": 1.1e-3}
    profile = CalibrationProfile.model_validate({
        "fingerprint": fingerprint,
        "matmul": [
            {**sample, "dtype": "bfloat16"}, {**sample, "dtype": "float8_e4m3fnuz", "seconds": 0.6e-3},
        ],
    })
    gpu = profile.catalog_gpu()
    assert gpu is not None and gpu.name == "MI300X"
    assert profile.fingerprint.hip_version == "7.2.41134"


def test_a_profile_without_a_hip_version_keeps_its_id() -> None:
    fingerprint = {"device_name": "NVIDIA H100 80GB HBM3", "device_count": 8, "backend": "nccl",
                   "torch_version": "2.13.0", "cuda_version": "13.0"}
    profile = CalibrationProfile.model_validate({"fingerprint": fingerprint})
    # What a profile was before the field existed: its id is the digest of that document (which had
    # no grouped GEMMs either).
    before = profile.model_dump_json(
        exclude={"allocator_config": True, "grouped_gemm": True, "fingerprint": {"hip_version"}}
    )
    assert "hip_version" not in before
    assert profile.content_id() == f"profile-{hashlib.sha256(before.encode()).hexdigest()[:12]}"
    on_rocm = profile.fingerprint.model_copy(update={"hip_version": "7.2"})
    assert profile.model_copy(update={"fingerprint": on_rocm}).content_id() != profile.content_id()
