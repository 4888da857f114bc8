import os

import pytest

# Hermetic, quiet, CPU-only test process (set before vLLM, Ray or torch read them).
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no hub here: a model id that is not cached fails at once


@pytest.fixture(scope="session", autouse=True)
def tba_cache(tmp_path_factory):
    """Embedded models for the test session are built into a fresh cache (Ray workers inherit the variable)."""
    path = os.environ.get("RLLIB_TBA_TEST_CACHE") or str(tmp_path_factory.mktemp("tba-cache"))
    os.environ["RLLIB_TBA_CACHE"] = path
    return path


@pytest.fixture(scope="session")
def tiny_model(tba_cache):
    from envs.models import resolve_model

    return resolve_model("tiny-test")


@pytest.fixture(scope="session")
def ray_session():
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"RLLIB_TBA_CACHE": os.environ["RLLIB_TBA_CACHE"]}})
    yield ray
    ray.shutdown()
