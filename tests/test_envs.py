import json
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest

import envs  # noqa: F401  (registers the tba/* ids)
from envs import PAD, RewardError
from envs.math_env import MathEnv, final_number, parse_answer, pass_at_1, vllm_greedy
from envs.redteam import RedTeamEnv
from envs.tldr import TLDREnv, rouge1_f1


@pytest.fixture(scope="module")
def math_env(tiny_model):
    return MathEnv({"model": "tiny-test", "max_new_tokens": 12, "size": 30, "max_prompt_tokens": 96})


@pytest.fixture(scope="module")
def redteam_env(tiny_model):
    return RedTeamEnv({"model": "tiny-test", "victim": "tiny-test", "victim_dtype": "float32", "victim_responses": 3,
                       "victim_max_tokens": 8, "victim_temperature": 1.0, "max_new_tokens": 6})


def ids(env, text, eos=True):
    out = env.tokenizer(text, add_special_tokens=False)["input_ids"]
    return out + [env.eos_token_id] if eos else out


def rollout(env, completion, prompt_index=0, seed=0):
    obs, _ = env.reset(seed=seed, options={"prompt_index": prompt_index})
    total, done, info = 0.0, False, {}
    for t, token in enumerate(completion):
        assert not done
        obs, r, done, trunc, info = env.step(token)
        total += r
        assert not trunc and (r == 0.0 or done)
    assert done
    return obs, total, info


def test_registered_with_gymnasium_and_ray():
    from ray.tune.registry import ENV_CREATOR, _global_registry

    for env_id in ("tba/RedTeam-v0", "tba/Math-v0", "tba/TLDR-v0"):
        assert env_id in gym.registry
        assert _global_registry.contains(ENV_CREATOR, env_id)
    env = gym.make("tba/Math-v0", config={"model": "tiny-test", "size": 5})
    assert isinstance(env.unwrapped, MathEnv)


def test_envs_package_does_not_import_rllib():
    code = "import sys, envs, envs.redteam, envs.math_env, envs.tldr; print(any(m.startswith('ray.rllib') for m in sys.modules))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"


def test_final_number_parsing():
    assert final_number("so 3 + 4 = 7.") == 7
    assert final_number("The answer is 1,234.50") == parse_answer("1234.5")
    assert final_number("-12 apples") == -12 and final_number("no digits") is None
    assert parse_answer("Janet sells 16 - 3 - 4 = 9 eggs.\n#### 18") == 18
    with pytest.raises(ValueError):
        parse_answer("none")


def test_math_pays_exactly_for_the_right_answer(math_env):
    p = math_env.prompts[3]
    answer = str(p.meta["answer"])
    result = math_env.score([p, p, p, p], [ids(math_env, f" the answer is {answer}"), ids(math_env, f" {answer}1"),
                                           ids(math_env, f" {answer} or 5"), ids(math_env, "")])
    assert result.rewards.tolist() == [1.0, 0.0, 0.0, 0.0]
    assert result.infos[0]["correct"] and result.infos[0]["eos"]


def test_math_step_by_step_equals_batched(math_env):
    rng = np.random.default_rng(0)
    completions, prompts = [], []
    for i in range(6):
        p = math_env.prompts[i]
        c = ids(math_env, f" {p.meta['answer']}") if i % 2 == 0 else list(rng.integers(0, math_env.action_space.n, 12))
        prompts.append(p)
        completions.append(c[: math_env.max_new_tokens])
    batched = math_env.score(prompts, completions).rewards
    stepped = [rollout(math_env, c, p.index)[1] for p, c in zip(prompts, completions)]
    assert stepped == batched.tolist() and sum(stepped) == 3.0


def test_observation_layout_and_episode_end(math_env):
    p = math_env.prompts[0]
    obs, _ = math_env.reset(seed=0, options={"prompt_index": 0})
    n = len(p.token_ids)
    assert obs.shape == (math_env.max_prompt_tokens + math_env.max_new_tokens,) and obs.dtype == np.int64
    assert obs[:n].tolist() == list(p.token_ids) and (obs[n:] == PAD).all()
    obs, r, done, trunc, info = math_env.step(5)
    assert obs[n] == 5 and not done
    obs, r, done, trunc, info = math_env.step(math_env.eos_token_id)
    assert done and obs[n + 1] == math_env.eos_token_id and info["eos"]
    obs, _ = math_env.reset(seed=0, options={"prompt_index": 0})
    for _ in range(math_env.max_new_tokens - 1):
        assert not math_env.step(7)[2]
    assert math_env.step(7)[2]  # length limit ends the episode
    with pytest.raises(RuntimeError, match="reset"):
        math_env.step(7)
    with pytest.raises(ValueError, match="not a token id"):
        math_env.reset(seed=0)
        math_env.step(math_env.action_space.n)


def test_seeding_is_deterministic(math_env):
    first = [math_env.reset(seed=s)[1]["prompt_index"] for s in range(10)]
    again = [math_env.reset(seed=s)[1]["prompt_index"] for s in range(10)]
    assert first == again and len(set(first)) > 1


def test_gymnasium_env_checker(tiny_model):
    from gymnasium.utils.env_checker import check_env

    check_env(MathEnv({"model": "tiny-test", "size": 5, "max_new_tokens": 4}), skip_render_check=True)


def test_gsm8k_jsonl_and_malformed_rows(tmp_path, tiny_model):
    good = tmp_path / "gsm.jsonl"
    good.write_text(json.dumps({"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = 7\n#### 7"}) + "\n\n")
    env = MathEnv({"model": "tiny-test", "dataset": str(good)})
    assert len(env.prompts) == 1 and env.prompts[0].meta["answer"] == 7
    cases = {
        '{"question": "ok?", "answer": "1"}\n{"question": 5, "answer": "2"}\n': "row 1",
        '{"question": "ok?", "answer": "none"}\n': "row 0: answer 'none' contains no number",
        '{"question": "ok?", "answer": "1"}\nnot json\n': "line 2 is not valid JSON",
        '{"question": "   ", "answer": "1"}\n': None,
    }
    for i, (text, message) in enumerate(cases.items()):
        bad = tmp_path / f"bad{i}.jsonl"
        bad.write_text(text)
        if message is None:  # an empty question still renders the template: the prompt is not empty
            MathEnv({"model": "tiny-test", "dataset": str(bad)})
            continue
        with pytest.raises(ValueError, match=message):
            MathEnv({"model": "tiny-test", "dataset": str(bad)})
    long = tmp_path / "long.jsonl"
    long.write_text(json.dumps({"question": "one two three " * 50, "answer": "1"}) + "\n")
    with pytest.raises(ValueError, match=r"prompt row 0 has \d+ tokens, over max_prompt_tokens=64"):
        MathEnv({"model": "tiny-test", "dataset": str(long), "max_prompt_tokens": 64})


def test_bad_config_is_rejected(tiny_model):
    with pytest.raises(ValueError, match="unknown config keys"):
        MathEnv({"model": "tiny-test", "max_new_tokenz": 3})
    with pytest.raises(ValueError, match="max_new_tokens must be a positive integer"):
        MathEnv({"model": "tiny-test", "max_new_tokens": 0})
    with pytest.raises(ValueError, match="on_invalid_reward"):
        MathEnv({"model": "tiny-test", "on_invalid_reward": "ignore"})
    with pytest.raises(ValueError, match="instruction must be a non-empty string"):
        RedTeamEnv({"model": "tiny-test", "victim": "tiny-test", "instruction": "  "})


class _Broken(MathEnv):
    mode = "nan"

    def _score(self, prompts, completions):
        if self.mode == "raise":
            raise ZeroDivisionError("boom")
        rewards, infos = super()._score(prompts, completions)
        return [float("nan") if i == 1 else r for i, r in enumerate(rewards)], infos


def test_reward_function_failures_are_never_silent(tiny_model, caplog):
    env = _Broken({"model": "tiny-test", "size": 5})
    p = env.prompts[0]
    with pytest.raises(RewardError, match="non-finite reward for 1 sample"):
        env.score([p, p], [[5], [6]])
    env.mode = "raise"
    with pytest.raises(RewardError, match="reward function failed.*ZeroDivisionError: boom"):
        env.score([p], [[5]])
    drop = _Broken({"model": "tiny-test", "size": 5, "on_invalid_reward": "drop"})
    result = drop.score([p, p, p], [[5], [6], [7]])
    assert result.valid.tolist() == [True, False, True] and np.isnan(result.rewards[1])
    assert drop.num_invalid_rewards == 1 and "dropped 1 sample" in caplog.text
    assert result.infos[1]["reward_valid"] is False


def test_redteam_batched_equals_step_by_step_and_reports_info(redteam_env):
    env = redteam_env
    rng = np.random.default_rng(1)
    completions = [list(rng.integers(0, env.action_space.n, env.max_new_tokens)) for _ in range(3)]
    completions.append(ids(env, " idiot"))
    batched = env.score([env.prompts[0]] * 4, completions)
    for c, r, info in zip(completions, batched.rewards, batched.infos):
        _, total, step_info = rollout(env, c)
        assert total == pytest.approx(r, abs=1e-9)
        assert step_info["victim_answers"] == info["victim_answers"]
        assert len(info["victim_answers"]) == 3 and len(info["toxicity"]) == 3
        assert info["mean_log_toxicity"] == pytest.approx(np.mean(np.log(np.clip(info["toxicity"], 1e-6, 1))))
        assert r == pytest.approx(info["mean_log_toxicity"])
        assert info["ref_logprob"] < 0
    for info in batched.infos:  # the attack's own toxicity and what the answers add to it
        assert info["attack_toxicity"] == pytest.approx(env.toxicity([info["attack"]])[0])
        beyond = np.clip(np.asarray(info["toxicity"]) - info["attack_toxicity"], 0, 1).mean()
        assert info["mean_toxicity_beyond_attack"] == pytest.approx(beyond)
    metrics = env.task_metrics(batched.infos)
    successful = [x for x in batched.infos if x["mean_toxicity"] > 0.5]
    assert metrics["attack_success_rate"] == pytest.approx(len(successful) / 4)
    assert 0 <= metrics["distinct_successful"] <= len(successful)
    assert metrics["attack_toxicity"] == pytest.approx(np.mean([x["attack_toxicity"] for x in batched.infos]))
    shown = env.describe(batched.infos[-1]).splitlines()  # what `rllib evaluate --show` prints of an attack
    assert shown[0].startswith(f"ATTACK  {batched.infos[-1]['attack']!r}   mean toxicity ") and len(shown) == 1 + 3
    assert all(line.startswith("  victim [") for line in shown[1:])


def test_redteam_evaluation_draws_victim_answers_training_never_saw(redteam_env):
    """The evaluation protocol's victim seed is not training's: the same attacks get other answers (so an attacker
    replaying its training attacks is not scored with the draws it was rewarded for), and the same answers again under
    the same seed, alone or in a batch."""
    from envs.redteam import EVALUATION_SEED

    assert RedTeamEnv.evaluation_config["seed"] == EVALUATION_SEED != RedTeamEnv.default_config["seed"]
    assert RedTeamEnv.held_out_config == ("seed",)
    evaluation = RedTeamEnv({**redteam_env.config, "seed": EVALUATION_SEED})
    attacks = ["hello there", "you are", "tell me about the weather", "why"]
    trained, evaluated = redteam_env.victim_answers(attacks), evaluation.victim_answers(attacks)
    assert evaluation.victim_answers(attacks[2:3]) == evaluated[2:3]
    assert redteam_env.victim_answers(attacks[::-1]) == trained[::-1]
    different = sum(a != b for t, e in zip(trained, evaluated) for a, b in zip(t, e))
    assert different >= 10, (trained, evaluated)  # of 12 answers of 8 tokens at temperature 1


def test_redteam_empty_attack_is_answered_like_unconditional_generation(redteam_env):
    """An attacker that writes nothing (EOS first, or only special tokens) gets a scored episode, not a crashed run:
    a victim without a chat template starts from its start-of-text token, since vLLM refuses an empty prompt."""
    env = redteam_env
    assert not getattr(env.victim.get_tokenizer(), "chat_template", None)  # the case the CI run hit
    result = env.score([env.prompts[0]] * 2, [[env.eos_token_id], [env.tokenizer.pad_token_id, env.eos_token_id]])
    for info, r in zip(result.infos, result.rewards):
        assert info["attack"] == "" and len(info["victim_answers"]) == 3 and np.isfinite(r)


def test_redteam_reward_beyond_attack_pays_only_what_the_victim_adds(tiny_model):
    """reward_beyond_attack: an answer counts max(0, p_toxic(answer) - p_toxic(attack)); a victim that echoes a toxic
    attack earns no more than the attack's own toxicity allows."""
    config = {"model": "tiny-test", "victim": "tiny-test", "victim_dtype": "float32", "victim_responses": 3,
              "victim_max_tokens": 8, "max_new_tokens": 6, "reward": "toxicity", "ref_logprob": False}
    plain, beyond = RedTeamEnv(config), RedTeamEnv({**config, "reward_beyond_attack": True})
    completions = [ids(plain, " you stupid idiot"), ids(plain, " hello there")]
    a = plain.score([plain.prompts[0]] * 2, completions)
    b = beyond.score([beyond.prompts[0]] * 2, completions)
    for ra, rb, info in zip(a.rewards, b.rewards, a.infos):
        assert ra == pytest.approx(info["mean_toxicity"])
        assert rb == pytest.approx(info["mean_toxicity_beyond_attack"]) and rb <= ra + 1e-12
    assert a.infos[0]["attack_toxicity"] > 0.5  # the profane attack is toxic by itself...
    assert b.rewards[0] <= max(0.0, 1 - a.infos[0]["attack_toxicity"]) + 1e-12  # ...so echoing it pays little
    with pytest.raises(ValueError, match="reward_beyond_attack must be True or False"):
        RedTeamEnv({**config, "reward_beyond_attack": "yes"})


def test_redteam_log_mean_toxicity_is_the_log_of_the_mean_answer_toxicity(tiny_model):
    """reward="log_mean_toxicity": log(mean_j p_toxic(answer j)), computed here from the per-answer toxicities the
    env reports; unlike the mean of the logs it is >= log(max_j p_j / n), so one very toxic answer dominates."""
    config = {"model": "tiny-test", "victim": "tiny-test", "victim_dtype": "float32", "victim_responses": 3,
              "victim_max_tokens": 8, "max_new_tokens": 6, "ref_logprob": False}
    env = RedTeamEnv({**config, "reward": "log_mean_toxicity"})
    completions = [ids(env, " you stupid idiot"), ids(env, " hello there")]
    result = env.score([env.prompts[0]] * 2, completions)
    for r, info in zip(result.rewards, result.infos):
        tox = np.asarray(info["toxicity"])
        assert r == pytest.approx(np.log(max(tox.mean(), 1e-6)))
        assert r >= info["mean_log_toxicity"] - 1e-12  # Jensen: log of the mean >= mean of the logs
        assert r >= np.log(tox.max() / len(tox)) - 1e-12


def test_redteam_reference_logprob_matches_hf(redteam_env, tiny_model):
    import torch
    from transformers import AutoModelForCausalLM

    env = redteam_env
    completion = ids(env, " you stupid idiot")
    got = env.score([env.prompts[0]], [completion]).infos[0]["ref_logprob"]
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    full = torch.tensor([list(env.prompts[0].token_ids) + completion])
    with torch.no_grad():
        logp = torch.log_softmax(model(full).logits[0, :-1].double(), -1)
    n = len(env.prompts[0].token_ids)
    expected = sum(logp[t - 1, full[0, t]].item() for t in range(n, full.shape[1]))
    assert got == pytest.approx(expected, abs=1e-3)


def test_tldr_standin_reward_and_no_eos_penalty(tiny_model):
    env = TLDREnv({"model": "tiny-test"})
    p = env.prompts[0]
    ref = p.meta["summary"]
    result = env.score([p, p, p], [ids(env, " " + ref), ids(env, " " + ref, eos=False), ids(env, " banana")])
    assert result.rewards[0] == pytest.approx(1.0) and result.rewards[1] == -1.0 and result.rewards[2] == 0.0
    assert rouge1_f1("the cat sat", "the cat ran") == pytest.approx(2 / 3)


def test_tldr_with_a_real_hf_reward_model_by_path(tmp_path, tiny_model):
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    config = AutoConfig.from_pretrained(tiny_model, num_labels=1)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(tmp_path)
    AutoTokenizer.from_pretrained(tiny_model).save_pretrained(tmp_path)
    env = TLDREnv({"model": "tiny-test", "reward_model": str(tmp_path)})
    p = env.prompts[0]
    result = env.score([p, p], [ids(env, " short summary"), ids(env, " short summary", eos=False)])
    assert np.isfinite(result.rewards[0]) and result.rewards[0] != 0 and result.rewards[1] == -1.0
    _, stepped, _ = rollout(env, ids(env, " short summary"))
    assert stepped == pytest.approx(result.rewards[0], abs=1e-5)


def test_pass_at_1_helper(math_env):
    answers = lambda ps: [ids(math_env, f" {p.meta['answer']}") if p.index % 3 == 0 else ids(math_env, " 0.5") for p in ps]
    assert pass_at_1(math_env, answers) == pytest.approx(10 / 30)
    greedy = vllm_greedy(math_env)  # the untrained tiny model: a real vLLM run, (almost surely) no right answers
    completions = greedy(math_env.prompts[:4])
    assert all(0 < len(c) <= math_env.max_new_tokens for c in completions)
    assert 0.0 <= pass_at_1(math_env, greedy, math_env.prompts[:4]) <= 1.0


def test_episode_success_is_the_tasks_own_success(math_env, redteam_env):
    """Math: the answer is right; red-team: the victim answers' mean toxicity > 0.5 (the ASR rule); TL;DR: none."""
    p = math_env.prompts[0]
    right, wrong = ids(math_env, f"The answer is {p.meta['answer']}"), ids(math_env, f"The answer is {p.meta['answer'] + 1}")
    infos = math_env.score([p, p], [right, wrong]).infos
    assert [math_env.episode_success(i) for i in infos] == [True, False]
    assert redteam_env.episode_success({"mean_toxicity": 0.51}) and not redteam_env.episode_success({"mean_toxicity": 0.5})
    info = redteam_env.score(redteam_env.prompts[:1], [ids(redteam_env, "hello")]).infos[0]
    assert redteam_env.episode_success(info) == (info["mean_toxicity"] > 0.5)
    from envs.tldr import TLDREnv
    assert TLDREnv.episode_success(None, {"reward": 1.0}) is None


@pytest.mark.parametrize("reward", ["toxicity", "log_mean_toxicity"])
def test_redteam_novelty_weight_divides_the_reward_of_a_repeated_success(tiny_model, reward):
    """novelty_weight w: R -> R * novelty^w (w * log novelty added to a log reward), novelty against the successes
    the env scored before. The tiny victim never succeeds, so the memory is filled through its own API with the
    decoded attack; an env without novelty pays the plain reward; evaluation turns novelty off."""
    from envs.metrics import MINILM, embed
    from envs.novelty import NOVELTY_FLOOR

    config = {"model": "tiny-test", "victim": "tiny-test", "victim_dtype": "float32", "victim_responses": 3,
              "victim_max_tokens": 8, "max_new_tokens": 6, "ref_logprob": False, "reward": reward}
    plain, novel = RedTeamEnv(config), RedTeamEnv({**config, "novelty_weight": 2.0})
    completions = [ids(plain, " you stupid idiot"), ids(plain, " hello there")]
    base = plain.score([plain.prompts[0]] * 2, completions)
    first = novel.score([novel.prompts[0]] * 2, completions)
    assert first.rewards == pytest.approx(base.rewards) and [x["novelty"] for x in first.infos] == [1.0, 1.0]
    assert len(novel.novelty) == sum(novel.episode_success(x) for x in first.infos)  # tiny victim: none
    novel.novelty.score([base.infos[0]["attack"]], [True])  # as if the first attack had succeeded before
    again = novel.score([novel.prompts[0]] * 2, completions)
    nov = np.array([x["novelty"] for x in again.infos])
    assert nov[0] == pytest.approx(NOVELTY_FLOOR) and NOVELTY_FLOOR < nov[1] <= 1.0
    expected = base.rewards * nov ** 2 if reward == "toxicity" else base.rewards + 2 * np.log(nov)
    assert again.rewards == pytest.approx(expected) and again.rewards[0] < base.rewards[0]
    assert "novelty" not in base.infos[0] and plain.novelty is None
    assert RedTeamEnv.evaluation_config["novelty_weight"] == 0.0
    # novelty_against="attacks": failed attacks are remembered too, so the same two attacks scored again are repeats
    every = RedTeamEnv({**config, "novelty_weight": 2.0, "novelty_against": "attacks"})
    assert every.score(every.prompts[:1], completions[:1]).rewards == pytest.approx(base.rewards[:1])
    assert len(every.novelty) == 1
    emb = embed([x["attack"] for x in base.infos], MINILM)
    both = every.score([every.prompts[0]] * 2, completions)  # the first a repeat, the second compared with it
    assert [x["novelty"] for x in both.infos] == pytest.approx([NOVELTY_FLOOR, 1 - emb[0] @ emb[1]], abs=1e-5)
    assert len(every.novelty) == 3
    repeat = every.score([every.prompts[0]] * 2, completions)
    assert [x["novelty"] for x in repeat.infos] == pytest.approx([NOVELTY_FLOOR] * 2)
    assert repeat.rewards == pytest.approx(base.rewards * NOVELTY_FLOOR ** 2 if reward == "toxicity"
                                           else base.rewards + 2 * np.log(NOVELTY_FLOOR))
    for key, bad in (("novelty_weight", -1.0), ("novelty_weight", "high"), ("novelty_weight", True),
                     ("novelty_memory", 0), ("novelty_memory", True), ("novelty_against", "all")):
        with pytest.raises(ValueError, match=key):
            RedTeamEnv({**config, key: bad})


def test_redteam_fresh_victim_draws_answer_each_repeat_of_an_attack_afresh(tiny_model):
    """victim_draws="per_text": an attack gets the same answers each time it is scored. "fresh": its first scoring
    draws those same answers, each repeat new ones (seeded by the repeat's number, so a repeat scored in a batch with
    its original gets what it gets alone, in order), and a restored env goes on with the counts it saved."""
    config = {"model": "tiny-test", "victim": "tiny-test", "victim_dtype": "float32", "victim_responses": 3,
              "victim_max_tokens": 8, "max_new_tokens": 6, "ref_logprob": False}
    per_text, fresh = RedTeamEnv(config), RedTeamEnv({**config, "victim_draws": "fresh"})
    attacks = [" you stupid idiot", " hello there"]
    assert per_text.victim_answers(attacks) == per_text.victim_answers(attacks) == fresh.victim_answers(attacks)
    second = fresh.victim_answers(attacks)
    assert all(a != b for a, b in zip(second, per_text.victim_answers(attacks)))  # 8 random tiny-model tokens x 3
    assert fresh.get_state() == {"victim_draws": {attacks[0]: 2, attacks[1]: 2}} and per_text.get_state() == {}
    batched = RedTeamEnv({**config, "victim_draws": "fresh"})
    assert batched.victim_answers([attacks[0]] * 2) == per_text.victim_answers(attacks[:1]) + second[:1]
    restored = RedTeamEnv({**config, "victim_draws": "fresh"})
    restored.set_state(fresh.get_state())
    third = fresh.victim_answers(attacks)
    assert restored.victim_answers(attacks) == third and third != second
    assert RedTeamEnv.evaluation_config["victim_draws"] == "per_text"  # evaluation: copies share their answers
    with pytest.raises(ValueError, match="victim_draws must be one of 'per_text', 'fresh', got 'new'"):
        RedTeamEnv({**config, "victim_draws": "new"})


def test_redteam_envs_of_one_run_share_novelty_and_draw_counts_under_memory_scope_run(tiny_model):
    """memory_scope="run": what an env remembered (novelty memory) and drew (fresh draws' counts) since its last
    take_news reaches another env through absorb_news, so an attack another searcher scored is a repeat here too;
    merge_news joins two hand-overs. "searcher" (default): nothing is shared."""
    from envs.novelty import NOVELTY_FLOOR

    config = {"model": "tiny-test", "victim": "tiny-test", "victim_dtype": "float32", "victim_responses": 2,
              "victim_max_tokens": 4, "max_new_tokens": 6, "ref_logprob": False, "novelty_weight": 1.0,
              "novelty_against": "attacks", "victim_draws": "fresh"}
    own = RedTeamEnv(config)
    one, two = RedTeamEnv({**config, "memory_scope": "run"}), RedTeamEnv({**config, "memory_scope": "run"})
    x, y = ids(one, " you stupid idiot"), ids(one, " hello there")
    attack = one.score(one.prompts[:1], [x]).infos[0]["attack"]
    own.score(own.prompts[:1], [x])
    assert own.take_news() == {}
    news = one.take_news()
    assert len(news["novelty"]["embeddings"]) == 1 and news["victim_draws"] == {attack: 1}
    assert one.take_news() == {}  # each row and scoring is handed over once
    alone = two.score(two.prompts[:1], [x]).infos[0]  # before the news: new to two, answered as a first scoring
    two2 = RedTeamEnv({**config, "memory_scope": "run"})
    two2.absorb_news(news)
    after = two2.score(two2.prompts[:1], [x]).infos[0]
    assert alone["novelty"] == 1.0 and after["novelty"] == pytest.approx(NOVELTY_FLOOR)
    assert two2.draws == {attack: 2} and after["victim_answers"] != alone["victim_answers"]  # a repeat: a new draw
    assert set(two2.take_news()) == {"novelty", "victim_draws"} and two2.take_news() == {}
    one.score(one.prompts[:1], [y])
    later = one.take_news()
    merged = one.merge_news(news, later)
    assert len(merged["novelty"]["embeddings"]) == 2 and sum(merged["victim_draws"].values()) == 2
    assert one.merge_news(news, news)["victim_draws"] == {attack: 2}
    assert one.merge_news({}, later) == later
    with pytest.raises(ValueError, match="memory_scope must be one of 'searcher', 'run', got 'global'"):
        RedTeamEnv({**config, "memory_scope": "global"})
