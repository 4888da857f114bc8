"""Token-level LLM tasks as gymnasium environments (no RLlib dependency).

Registered ids (gymnasium, and Ray's env registry when Ray is installed): ``tba/RedTeam-v0``, ``tba/Math-v0``,
``tba/TLDR-v0``. Pass task options as one ``config`` dict: ``gym.make("tba/Math-v0", config={"model": "tiny-test"})``.
"""

from envs.token_env import PAD, Prompt, RewardError, ScoreResult, TokenEnv

ENV_IDS = {
    "tba/RedTeam-v0": "envs.redteam:RedTeamEnv",
    "tba/Math-v0": "envs.math_env:MathEnv",
    "tba/TLDR-v0": "envs.tldr:TLDREnv",
}


def _creator(entry_point: str):
    def create(config=None):
        import importlib

        module, cls = entry_point.split(":")
        return getattr(importlib.import_module(module), cls)(dict(config or {}))

    return create


def register_envs() -> None:
    """Register the tasks with gymnasium and (if importable) Ray's env registry. Idempotent."""
    import gymnasium as gym

    for env_id, entry_point in ENV_IDS.items():
        if env_id not in gym.registry:
            gym.register(env_id, entry_point=entry_point, disable_env_checker=True)
    try:
        from ray.tune.registry import register_env
    except ImportError:
        return
    for env_id, entry_point in ENV_IDS.items():
        register_env(env_id, _creator(entry_point))


register_envs()

__all__ = ["ENV_IDS", "PAD", "Prompt", "RewardError", "ScoreResult", "TokenEnv", "register_envs"]
