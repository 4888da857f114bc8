"""MLE smoothing (rllib_tba/mle_smoothing.py): which samples it fits, its loss against per-sample log-probs computed
one sequence at a time, and that a fit starts from the reference and moves the policy towards the samples."""

import numpy as np
import pytest
import torch

from rllib_tba.mle_smoothing import completion_nll, fit, high_reward_samples, reset_to_reference


def test_high_reward_samples_keeps_each_distinct_high_reward_sample_once():
    # buffer rows as TBAReplayBuffer.get_state() writes them: (prompt_key, prompt_ids, completion, reward, version, ...)
    rows = [(0, (1, 2), np.array([5, 6]), -0.1, 0), (0, (1, 2), np.array([5, 7]), -3.0, 0),
            (1, (3,), np.array([5, 6]), -0.5, 1),  # the same completion of another prompt: another sample
            (0, (1, 2), np.array([5, 6]), -0.2, 2),  # a repeat of the first: taken once
            (0, (1, 2), np.array([8]), -0.693, 3)]  # exactly at the bound: kept
    assert high_reward_samples({"samples": rows}, -0.693) == [((1, 2), (5, 6)), ((3,), (5, 6)), ((1, 2), (8,))]
    assert high_reward_samples({"samples": rows}, 0.0) == []


def test_completion_nll_matches_per_sample_log_probs(tiny_model):
    """Padded batch of two prompts of different lengths = each sequence's own completion log-probs (logits / T)."""
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_pretrained(tiny_model).eval()
    samples = [((5, 9, 33), (7, 11)), ((4,), (12, 13, 14))]
    temperature = 0.7
    total, tokens = 0.0, 0
    with torch.no_grad():
        for prompt, completion in samples:
            ids = torch.tensor([list(prompt) + list(completion)])
            logp = torch.log_softmax(lm(ids).logits[0].double() / temperature, dim=-1)
            for t, token in enumerate(completion):
                total -= float(logp[len(prompt) + t - 1, token])  # position p predicts token p + 1
                tokens += 1
        got = float(completion_nll(lm, samples, temperature))
    assert got == pytest.approx(total / tokens, rel=1e-4)


@pytest.mark.parametrize("lora", [None, {"r": 4, "lora_alpha": 8, "target_modules": "all-linear"}])  # the example's
def test_fit_restarts_from_the_reference_and_fits_the_samples(tiny_model, lora):
    import gymnasium as gym
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec
    from transformers import AutoModelForCausalLM

    from envs import PAD
    from rllib_tba.tba_rl_module import TBARLModule

    module = RLModuleSpec(module_class=TBARLModule, observation_space=gym.spaces.Box(PAD, 383, (16,), np.int64),
                          action_space=gym.spaces.Discrete(384),
                          model_config={"model": "tiny-test", "lora": lora}).build()
    reference = AutoModelForCausalLM.from_pretrained(tiny_model).eval()
    samples = [((5, 9, 33), (7, 11, 7)), ((4, 8), (12, 13, 14)), ((5, 9, 33), (20, 21))]
    ids = torch.tensor([[5, 9, 33, 7]])
    with torch.no_grad():
        for p in module.lm.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.5)  # as if trained by TB: the policy is no longer the reference
        assert not torch.allclose(module.lm(ids).logits, reference(ids).logits, atol=1e-3)
        reset_to_reference(module)
        torch.testing.assert_close(module.lm(ids).logits, reference(ids).logits)
        start = float(completion_nll(reference, samples, 1.0))
    losses = fit(module, samples, epochs=30, lr=1e-2, batch_size=2, seed=0)
    assert len(losses) == 30 and losses[-1] < losses[0]
    with torch.no_grad():
        # each completion token e^1.5 ~ 4.5 times likelier on average than under the reference
        assert float(completion_nll(module.lm, samples, 1.0)) < start - 1.5
