"""TBA on the tiny test model (built in seconds) and the stand-in TL;DR data: a smoke run of the whole pipeline.

    rllib train file tuned_examples/tba_tiny.py          # one iteration, ~1 min on 2 cores

``tiny_config(**training)`` is the one tiny configuration the tests and ``tune_m_k.py`` start from.
"""

from rllib_tba import TBAConfig

TINY_TRAINING = dict(policy_model="tiny-test", max_new_tokens=6, lr=1e-3, beta=0.1, prompts_per_batch=2,
                     num_samples_per_prompt=4, generations_per_prompt=4, prompts_per_generation=2, min_buffer_size=8,
                     sync_every=1, searcher_dtype="float32")


def tiny_config(env="tba/TLDR-v0", env_config=None, num_env_runners=1, seed=0, **training) -> TBAConfig:
    """The tiny TL;DR configuration with ``training`` settings overriding TINY_TRAINING."""
    return (TBAConfig().environment(env, env_config=env_config or {}).training(**{**TINY_TRAINING, **training})
            .env_runners(num_env_runners=num_env_runners).debugging(seed=seed))


config = tiny_config(updates_per_iteration=2, training_intensity=4.0)
stop = {"training_iteration": 1}
