"""rllib-tba: Trajectory Balance with Asynchrony (arXiv 2503.18929) as a Ray RLlib algorithm.

``from rllib_tba import TBA, TBAConfig``; the algorithm is registered with Tune as ``"TBA"``.
"""

import envs  # noqa: F401  (registers the tba/* environments with gymnasium and Ray)
from rllib_tba.hf_rl_module import HFCausalLMRLModule
from rllib_tba.tb_loss import tb_loss
from rllib_tba.tba import TBA, TBAConfig
from rllib_tba.tba_replay_buffer import TBAReplayBuffer, TBSample
from rllib_tba.vllm_env_runner import VLLMEnvRunner


def _register() -> None:
    from ray.tune.registry import register_trainable

    register_trainable("TBA", TBA)


_register()

__all__ = ["HFCausalLMRLModule", "TBA", "TBAConfig", "TBAReplayBuffer", "TBSample", "VLLMEnvRunner", "tb_loss"]
