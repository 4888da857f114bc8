"""The HF causal-LM RLModule: logits equal plain HF logits; stock RLlib PPO (new API stack) trains with it."""

import numpy as np
import pytest
import torch

from envs import PAD


@pytest.fixture(scope="module")
def module(tiny_model):
    import gymnasium as gym
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    from rllib_tba import HFCausalLMRLModule

    spec = RLModuleSpec(module_class=HFCausalLMRLModule, observation_space=gym.spaces.Box(PAD, 383, (16,), np.int64),
                        action_space=gym.spaces.Discrete(384), model_config={"model": "tiny-test", "temperature": 0.7})
    return spec.build()


def test_action_logits_equal_hf_next_token_logits(module, tiny_model):
    from ray.rllib.core.columns import Columns
    from transformers import AutoModelForCausalLM

    from rllib_tba.tba_rl_module import response_logprobs

    hf = AutoModelForCausalLM.from_pretrained(tiny_model)
    rows = [[5, 9, 33, 7], [12, 40], [3, 3, 3, 3, 3, 3, 3]]
    obs = torch.full((3, 16), PAD, dtype=torch.long)
    for i, r in enumerate(rows):
        obs[i, : len(r)] = torch.tensor(r)
    out = module.forward_inference({Columns.OBS: obs})[Columns.ACTION_DIST_INPUTS]
    values = module.compute_values({Columns.OBS: obs})
    assert values.shape == (3,)
    with torch.no_grad():
        for i, r in enumerate(rows):
            expected = hf(torch.tensor([r])).logits[0, -1] / 0.7
            torch.testing.assert_close(out[i], expected, atol=1e-4, rtol=1e-4)
            # summed response log-probs (TBA's learner) agree with the same model: tokens 1.. as the response
            ids = torch.tensor([r])
            resp = torch.ones(1, len(r))
            resp[0, 0] = 0
            lp = response_logprobs(module.lm, ids, torch.ones_like(ids), resp, 0.7)
            ref = torch.log_softmax(hf(ids).logits[0, :-1] / 0.7, -1).gather(-1, ids[0, 1:, None])[:, 0].sum()
            torch.testing.assert_close(lp[0], ref, atol=1e-4, rtol=1e-5)


def test_stock_ppo_trains_on_the_math_env(ray_session, tiny_model):
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    from rllib_tba import HFCausalLMRLModule

    config = (
        PPOConfig()
        .environment("tba/Math-v0", env_config={"model": "tiny-test", "max_new_tokens": 4, "size": 16, "max_prompt_tokens": 64})
        .env_runners(num_env_runners=1, rollout_fragment_length=32)
        .rl_module(rl_module_spec=RLModuleSpec(module_class=HFCausalLMRLModule, model_config={"model": "tiny-test"}))
        .training(train_batch_size_per_learner=64, minibatch_size=32, num_epochs=1, lr=1e-4)
    )
    algo = config.build_algo()
    try:
        before = {k: v.copy() for k, v in algo.get_module().get_state().items()}
        for _ in range(2):
            result = algo.train()
        learner = result["learners"]["default_policy"]
        assert np.isfinite(learner["total_loss"])
        assert result["env_runners"]["num_episodes"] > 0
        after = algo.get_module().get_state()
        assert any(not np.allclose(before[k], after[k]) for k in before)  # PPO updated the LM
    finally:
        algo.stop()


def test_lora_module_trains_adapters_only_and_exports_merged_weights(tiny_model):
    """With LoRA the searchers get plain HF-named weights with the adapters merged in, equal in output."""
    import gymnasium as gym
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec
    from transformers import AutoModelForCausalLM

    from rllib_tba.tba_rl_module import TBARLModule

    spec = RLModuleSpec(module_class=TBARLModule, observation_space=gym.spaces.Box(PAD, 383, (16,), np.int64),
                        action_space=gym.spaces.Discrete(384),
                        model_config={"model": "tiny-test", "lora": {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]}})
    module = spec.build()
    trainable = [n for n, p in module.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    with torch.no_grad():
        for n, p in module.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)  # as if trained: the adapters now change the outputs
    state = module.get_state(inference_only=True)
    assert not any("lora_" in k or "base_layer" in k for k in state)
    plain = AutoModelForCausalLM.from_pretrained(tiny_model)
    before = plain(torch.tensor([[5, 9, 33, 7]])).logits
    plain.load_state_dict({k[len("lm."):]: torch.as_tensor(v) for k, v in state.items()})
    with torch.no_grad():
        ids = torch.tensor([[5, 9, 33, 7]])
        torch.testing.assert_close(plain(ids).logits, module.lm(ids).logits, atol=1e-5, rtol=1e-5)
        assert not torch.allclose(plain(ids).logits, before, atol=1e-3)
