"""Opening the GPU and refusing what it cannot do: clear colibri.errors exceptions for a
missing runtime, no matching adapter, limits too small, bad uploads and bad settings."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from colibri import errors
from colibri._core import gpu as core_gpu
from colibri._core import quant as q
from colibri.gpu import Adapter, choose_adapter, library_path, list_adapters, open_device
from colibri.gpu import runtime as gpu_runtime
from colibri.settings.gpu import GPUConfig


def test_lavapipe_is_listed_with_its_limits(lavapipe: str) -> None:
    adapters = list_adapters()
    assert [a.index for a in adapters] == list(range(len(adapters)))
    lvp = next(a for a in adapters if "llvmpipe" in a.name)
    assert (lvp.backend, lvp.adapter_type) == ("vulkan", "cpu")
    assert lvp.max_storage_binding_size >= 16 << 20 and lvp.max_workgroup_storage >= 1024
    assert lvp.max_workgroup_invocations >= 64
    assert lvp.shader_f16 and lvp.subgroups  # lavapipe has both (Mesa 22.3, LLVM 15)


def test_the_device_reports_its_adapter(device: core_gpu.Device) -> None:
    a = device.adapter
    assert "llvmpipe" in a["name"] and a["backend"] == "vulkan"
    assert a["max_buffer_size"] >= a["max_storage_binding_size"] > 0


def test_no_wgpu_package_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "wgpu" else real(name, *a))
    with pytest.raises(errors.GPUUnavailableError, match="wgpu package is not installed"):
        library_path()
    with pytest.raises(errors.GPUUnavailableError, match="colibri\\[gpu\\]"):
        open_device()


def test_a_missing_or_wrong_library_is_a_clear_error() -> None:
    with pytest.raises(errors.GPUUnavailableError, match="cannot load the wgpu-native library"):
        core_gpu.list_adapters("/nonexistent/libwgpu_native.so")
    # a real shared library that is not wgpu-native: a named missing function
    with pytest.raises(errors.GPUUnavailableError, match="not a usable wgpu-native library"):
        core_gpu.Device(_libz())


def _libz() -> str:
    import ctypes.util

    name = ctypes.util.find_library("z")
    assert name is not None
    return name


def test_limits_too_small_are_named(lavapipe: str) -> None:
    with pytest.raises(errors.GPUUnavailableError, match="limits too small: max storage binding"):
        core_gpu.Device(library_path(), 0, min_storage_binding=1 << 50)


def _fake(kind: str, name: str, index: int) -> Adapter:
    return Adapter(index=index, name=name, vendor="", description="", backend="vulkan",
                   adapter_type=kind, vendor_id=0, device_id=0,
                   max_storage_binding_size=1 << 27, max_buffer_size=1 << 28,
                   max_workgroup_storage=1 << 15, max_workgroup_invocations=1024,
                   max_workgroups_per_dimension=65535, shader_f16=True, subgroups=True)


def test_adapter_choice() -> None:
    adapters = [_fake("cpu", "llvmpipe", 0), _fake("integrated", "Intel Iris", 1),
                _fake("discrete", "NVIDIA RTX", 2)]
    assert choose_adapter(adapters, None).index == 2  # discrete first
    assert choose_adapter(adapters[:2], None).index == 1  # then integrated
    assert choose_adapter(adapters[:1], None).index == 0  # then anything
    assert choose_adapter(adapters, "iris").index == 1  # a part of the name, any case
    assert choose_adapter(adapters, 0).index == 0
    with pytest.raises(errors.GPUUnavailableError, match="matches no adapter.*0: llvmpipe"):
        choose_adapter(adapters, "radeon")
    with pytest.raises(errors.GPUUnavailableError, match="only 3 adapter"):
        choose_adapter(adapters, 5)
    with pytest.raises(errors.GPUUnavailableError, match="no GPU adapter found"):
        choose_adapter([], None)


def test_gpu_config_validation() -> None:
    assert GPUConfig().adapter is None and GPUConfig().memory_budget is None
    assert GPUConfig(memory_budget="1GiB").memory_budget == 1 << 30
    assert GPUConfig(adapter=" nvidia ").adapter == "nvidia"
    with pytest.raises(errors.ConfigError, match="memory_budgt.*memory_budget"):
        GPUConfig(memory_budgt="1GiB")  # type: ignore[call-arg]
    with pytest.raises(errors.ConfigError, match="GPUConfig.adapter: index -1 is out of range"):
        GPUConfig(adapter=-1)
    with pytest.raises(errors.ConfigError, match="GPUConfig.adapter: an empty name"):
        GPUConfig(adapter="")
    with pytest.raises(errors.ConfigError, match="GPUConfig.memory_budget"):
        GPUConfig(memory_budget=0)
    with pytest.raises(errors.ConfigError, match="GPUConfig.adapter: expected"):
        GPUConfig(adapter=1.5)  # type: ignore[arg-type]


def test_bad_uploads_are_refused(device: core_gpu.Device) -> None:
    data = q.quantize("Q8_0", np.ones(64, np.float32)).reshape(-1)
    with pytest.raises(errors.InvalidRequestError, match="are 68 bytes, got 67"):
        device.upload("Q8_0", data[:-1], 1, 64)
    with pytest.raises(errors.InvalidRequestError):  # not a whole number of blocks
        device.upload("Q8_0", data, 1, 63)
    # every weight type has a kernel now: an activation format stands for a type without one
    with pytest.raises(errors.UnsupportedError, match="no GPU kernel for Q8_K.*Q8_0"):
        device.upload("Q8_K", np.zeros(292, np.uint8), 1, 256)
    with pytest.raises(errors.InvalidRequestError, match="unknown|Q9_9"):
        device.upload("Q9_9", data, 1, 64)
    with pytest.raises(errors.InvalidRequestError, match="more than the GPU split size"):
        device.upload("Q8_0", data, 1, 64, split_bytes=60)
    with pytest.raises(errors.InvalidRequestError, match="above the adapter's binding limit"):
        device.upload("Q8_0", data, 1, 64, split_bytes=1 << 40)
    m = device.upload("Q8_0", data, 1, 64)
    with pytest.raises(errors.InvalidRequestError, match="1-D array of 64 floats"):
        device.matvec(m, np.ones(63, np.float32))
    assert device.matvec(m, np.ones(64, np.float32))[0] == pytest.approx(64.0, rel=1e-3)


def test_the_memory_budget_is_enforced(lavapipe: str) -> None:
    dev = open_device(GPUConfig(adapter="llvmpipe", memory_budget=100))
    data = q.quantize("Q8_0", np.ones(64, np.float32)).reshape(-1)  # 68 bytes
    m = dev.upload("Q8_0", data, 1, 64)
    assert dev.resident_bytes == 68
    with pytest.raises(errors.InvalidRequestError, match="GPU memory budget"):
        dev.upload("Q8_0", data, 1, 64)
    del m
    assert dev.resident_bytes == 0
    dev.upload("Q8_0", data, 1, 64)  # room again once the first is freed


def test_colibri_imports_and_runs_on_the_cpu_without_wgpu() -> None:
    code = ("import sys; sys.modules['wgpu'] = None\n"
            "import numpy as np, colibri\n"
            "from colibri._core import quant as q\n"
            "from colibri import gpu\n"
            "w = q.quantize('Q8_0', np.ones(32, np.float32))\n"
            "assert abs(q.dequantize('Q8_0', w, 1, 32)[0, 0] - 1) < 1e-3\n"
            "assert 'wgpu' not in [m for m in sys.modules if sys.modules[m] is not None]\n")
    subprocess.run([sys.executable, "-c", code], check=True, env=_child_env())


def _child_env() -> dict[str, str]:
    import os

    return {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}


def test_the_gpu_runtime_reads_no_environment_variable() -> None:
    """The driver is chosen by the Vulkan loader's own variables (see conftest.py), the
    library by its path; neither the core's GPU code nor colibri.gpu reads the environment."""
    csrc = Path(__file__).resolve().parents[2] / "csrc" / "gpu"
    sources = [*csrc.glob("*.[ch]pp"), Path(gpu_runtime.__file__)]
    assert len(sources) > 5
    for path in sources:
        text = path.read_text()
        assert "getenv" not in text and "os.environ" not in text, path


def test_doctor_lists_the_adapters(lavapipe: str, tmp_path: Path,
                                   monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    from colibri.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["doctor", "--no-measure"]) == 0
    out = capsys.readouterr().out
    assert "GPU adapters (WebGPU" in out and "llvmpipe" in out and "(vulkan, cpu)" in out
    assert "largest binding 128 MiB" in out
    assert main(["doctor", "--no-measure", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["gpu"]["error"] is None
    assert any("llvmpipe" in a["name"] for a in record["gpu"]["adapters"])


def test_doctor_without_a_gpu_runtime_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    from colibri.cli import main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "wgpu" else real(name, *a))
    monkeypatch.chdir(tmp_path)
    assert main(["doctor", "--no-measure"]) == 0  # a GPU is optional: not an error
    out = capsys.readouterr().out
    assert "none usable: no GPU runtime: the wgpu package is not installed" in out
