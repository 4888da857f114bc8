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
    rows = [[5, 9, 33, 7], [12, 40], [3, 3, 3, 3, 3, 3, 3], [5, 9], [3, 3, 3]]  # two rows share a longer row's pass
    obs = torch.full((len(rows), 16), PAD, dtype=torch.long)
    for i, r in enumerate(rows):
        obs[i, : len(r)] = torch.tensor(r)
    out = module.forward_inference({Columns.OBS: obs})[Columns.ACTION_DIST_INPUTS]
    values = module.compute_values({Columns.OBS: obs})
    assert values.shape == (len(rows),)
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


def test_prefix_representatives_match_brute_force():
    from rllib_tba.hf_rl_module import prefix_representatives

    rng = np.random.default_rng(0)
    rows = []
    for _ in range(6):  # episodes: every prefix of a random sequence, plus unrelated rows of equal lengths
        seq = rng.integers(0, 5, size=rng.integers(1, 9))
        rows += [seq[:n] for n in range(1, len(seq) + 1)]
    rows += [rng.integers(0, 5, size=rng.integers(1, 9)) for _ in range(20)] + [np.array([], np.int64)]
    obs = np.full((len(rows), 10), PAD, np.int64)
    for i, r in enumerate(rows):
        obs[i, : len(r)] = r
    order = rng.permutation(len(rows))
    obs, rows = obs[order], [rows[i] for i in order]
    rep = prefix_representatives(obs)
    for i, r in enumerate(rows):
        containing = [j for j, s in enumerate(rows) if len(s) >= len(r) and np.array_equal(s[: len(r)], r)]
        if len(r) == 0:
            assert rep[i] == i
            continue
        assert rep[i] in containing and len(rows[rep[i]]) == max(len(rows[j]) for j in containing)


def test_ppo_with_vllm_env_runner(ray_session, tiny_model):
    """Stock PPO sampling through the vLLM EnvRunner: the learner connector supplies ACTION_DIST_INPUTS, RLlib's
    env-runner metrics are reported, and after PPO's weight sync vLLM's sampler log-probs are the learner's."""
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    from rllib_tba import HFCausalLMRLModule, VLLMEnvRunner
    from rllib_tba.action_dist_connector import AddActionDistInputsFromModule

    config = (
        PPOConfig()
        .environment("tba/TLDR-v0", env_config={"model": "tiny-test", "max_new_tokens": 8})
        # sample_timeout_s: on a busy machine RLlib's default 60 s could cut a sampling round short
        .env_runners(env_runner_cls=VLLMEnvRunner, num_env_runners=1, num_envs_per_env_runner=16, sample_timeout_s=600)
        .rl_module(rl_module_spec=RLModuleSpec(module_class=HFCausalLMRLModule, model_config={"model": "tiny-test"}))
        .learners(learner_connector=lambda *spaces: AddActionDistInputsFromModule())
        .training(train_batch_size_per_learner=64, minibatch_size=64, num_epochs=1, lr=1e-4,
                  shuffle_batch_per_epoch=False)
    )
    algo = config.build_algo()
    try:
        first = algo.train()
        learner = first["learners"]["default_policy"]
        # ACTION_DIST_INPUTS came from the learner connector: KL(sampling policy || policy after <= 2 small steps)
        assert 0 <= learner["mean_kl_loss"] < 0.05 and np.isfinite(learner["total_loss"])
        assert first["env_runners"]["num_env_steps_sampled"] >= 64
        assert first["env_runners"]["num_episodes_lifetime"] >= 8 and "task" in first["env_runners"]
        second = algo.train()
        assert second["env_runners"]["num_episodes_lifetime"] > first["env_runners"]["num_episodes_lifetime"]
        # after the sync, vLLM samples from the learner's weights: its log-probs equal the module's
        episodes = algo.env_runner_group.foreach_env_runner(lambda r: r.sample(num_episodes=4), local_env_runner=False)[0]
        module = algo.learner_group._learner.module["default_policy"]
        ep = episodes[0]
        obs = torch.as_tensor(np.asarray(ep.get_observations(slice(0, len(ep)))))
        with torch.no_grad():
            logits = module.forward_inference({"obs": obs})["action_dist_inputs"]
        logp = torch.log_softmax(logits, -1).gather(-1, torch.as_tensor(ep.get_actions())[:, None])[:, 0]
        np.testing.assert_allclose(ep.get_extra_model_outputs("action_logp"), logp.numpy(), atol=1e-4)
    finally:
        algo.stop()
