"""rllib-tba: Trajectory Balance with Asynchrony (arXiv 2503.18929) as a Ray RLlib algorithm."""

import envs  # noqa: F401  (registers the tba/* environments with gymnasium and Ray)
from rllib_tba.hf_rl_module import HFCausalLMRLModule

__all__ = ["HFCausalLMRLModule"]
