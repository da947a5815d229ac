"""The GPU tests run on Mesa's lavapipe (a Vulkan driver on the CPU), selected the standard
Vulkan way: VK_ICD_FILENAMES / VK_DRIVER_FILES (older and newer loaders) name its ICD file,
so whatever real GPU the machine has stays out of the results. The core reads neither
variable; the Vulkan loader does, when wgpu-native creates an instance."""

from __future__ import annotations

import glob
from collections.abc import Iterator

import pytest

from colibri._core import gpu as core_gpu
from colibri.gpu import open_device
from colibri.settings.gpu import GPUConfig

LAVAPIPE_ICDS = "/usr/share/vulkan/icd.d/lvp_icd.*.json"


@pytest.fixture(scope="session")
def lavapipe() -> Iterator[str]:
    """The lavapipe ICD file, set as the only Vulkan driver for the session."""
    found = sorted(glob.glob(LAVAPIPE_ICDS))
    assert found, (f"no lavapipe ICD at {LAVAPIPE_ICDS}: install mesa-vulkan-drivers "
                   "(scripts/test.sh does)")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VK_ICD_FILENAMES", found[0])
        mp.setenv("VK_DRIVER_FILES", found[0])
        yield found[0]


@pytest.fixture(scope="session")
def device(lavapipe: str) -> core_gpu.Device:
    return open_device(GPUConfig(adapter="llvmpipe"))
