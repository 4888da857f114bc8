import os
import sys
from pathlib import Path

import pytest

from envs.llm_runtime import configure_vllm_env

# Hermetic, quiet, CPU-only test process (set before vLLM, Ray or torch read them).
configure_vllm_env()
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no hub here: a model id that is not cached fails at once


# the script folders the tests import from (not packages): tuned_examples/ (`from tba_tiny import tiny_config`, the
# configuration the tests share with tuned_examples/tune_m_k.py; `import redteam_frontier`) and benchmarks/
TUNED_EXAMPLES = Path(__file__).resolve().parents[1] / "tuned_examples"
sys.path.insert(0, str(TUNED_EXAMPLES))
sys.path.insert(0, str(TUNED_EXAMPLES.parent / "benchmarks"))


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
