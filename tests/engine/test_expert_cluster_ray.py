"""Expert workers as Ray actors (colibri.engine.cluster.ray_transport), slow: a local Ray
started in this process (``ray.init`` on 127.0.0.1, its files in a temporary directory),
then ``Model.load(..., engine=EngineConfig(cluster=ClusterConfig(...)))`` with 1, 2 and 3
worker actors, each loading the same GGUF in its own process. The oracle is the same
file loaded without a cluster: logits bit-identical for prefill and decode, greedy tokens
identical. Bad input: a worker whose file differs (fingerprint), a path a worker cannot
load. The seam and the coordinator without Ray: test_expert_cluster.py (every run)."""

from __future__ import annotations

import importlib.util
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import colibri
from colibri.errors import ClusterError
from colibri.settings.cluster import ClusterConfig
from colibri.settings.config import EngineConfig, ThreadConfig
from support.cluster_helpers import assert_same_run, forward_run
from support.modelfactory import TinyModel

pytestmark = pytest.mark.slow

PROMPT = [1, 17, 93, 4, 250, 61, 8, 130, 77, 19, 201, 3, 45, 99, 12, 180]
ENGINE = EngineConfig(threads=ThreadConfig(n=1), context_length=128,
                      activation_precision="int8")


def _absolute_pythonpath() -> str:
    """PYTHONPATH for the worker processes (their working directory is Ray's): where this
    process found colibri and its core, then the rest of this process's path, absolute."""
    dirs = sorted({str(Path(p).resolve().parent) for p in colibri.__path__})
    rest = [str(Path(p).resolve()) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return os.pathsep.join(dict.fromkeys(dirs + rest))


@pytest.fixture(scope="module")
def ray_local() -> Iterator[Any]:
    if importlib.util.find_spec("ray") is None:
        pytest.skip("Ray is not installed (pip install 'colibri[ray]')")
    import ray

    tmp = tempfile.mkdtemp(prefix="colibri-ray-")  # short: Ray's socket paths live in it
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", _absolute_pythonpath())
        mp.setenv("RAY_USAGE_STATS_ENABLED", "0")
        ray.init(num_cpus=4, include_dashboard=False, _temp_dir=tmp, log_to_driver=False,
                 object_store_memory=100 * 2**20, _node_ip_address="127.0.0.1")
        try:
            yield ray
        finally:
            ray.shutdown()


@pytest.fixture(scope="module")
def reference(tiny_models: dict[str, TinyModel]) -> tuple[Path, Any, list[int]]:
    path = tiny_models["qwen2_moe"].gguf["Q4_0"]
    with colibri.Model.load(path, engine=ENGINE) as single:
        return path, forward_run(single, PROMPT), single.generate(PROMPT, max_tokens=16).token_ids


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_ray_workers_bit_identical(ray_local: Any, reference: tuple[Path, Any, list[int]],
                                   workers: int) -> None:
    path, want, want_tokens = reference
    cluster = ClusterConfig(address="auto", workers=workers, connect_timeout=300)
    with colibri.Model.load(path, engine=ENGINE.replace(cluster=cluster)) as model:
        assert_same_run(forward_run(model, PROMPT), want, f"{workers} Ray workers")
        assert model.generate(PROMPT, max_tokens=16).token_ids == want_tokens
        stats = model.runner.handle.cluster_stats()
        assert len(stats) == workers
        assert all(s.requests > 0 and s.round_trip_seconds > 0 for s in stats)
        assert model.runner.handle.core.store_stats().reads == 0


def test_ray_worker_with_another_file_is_refused(ray_local: Any,
                                                 tiny_models: dict[str, TinyModel]) -> None:
    path = tiny_models["qwen2_moe"].gguf["Q4_0"]
    other = tiny_models["qwen2_moe"].gguf["Q8_0"]
    cluster = ClusterConfig(address="auto", workers=2, model_path=str(other),
                            connect_timeout=300)
    with pytest.raises(ClusterError, match="another model file: fingerprint"):
        colibri.Model.load(path, engine=ENGINE.replace(cluster=cluster))


def test_ray_worker_that_cannot_load_is_a_cluster_error(ray_local: Any,
                                                        tiny_models: dict[str, TinyModel],
                                                        tmp_path: Path) -> None:
    cluster = ClusterConfig(address="auto", workers=1, model_path=str(tmp_path / "absent.gguf"),
                            connect_timeout=300)
    with pytest.raises(ClusterError, match="expert worker 0 failed to start: .*absent.gguf"):
        colibri.Model.load(tiny_models["qwen2_moe"].gguf["Q4_0"],
                           engine=ENGINE.replace(cluster=cluster))
