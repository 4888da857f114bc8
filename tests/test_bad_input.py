"""One clear message per bad input: each case must fail up front with a one-line message (its first line) that names
the bad thing and what is allowed. Config, env configs, data files, models and checkpoints here; the `rllib` command
line in test_workflows.py."""

import json
import math
import re

import pytest

from rllib_tba import TBAConfig


def first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0]


def tba_config(**training):
    kw = dict(policy_model="tiny-test", max_new_tokens=6)
    kw.update(training)
    return TBAConfig().environment("tba/TLDR-v0").training(**kw)


@pytest.mark.parametrize("change, message", [
    (dict(async_mode="no"), r"async_mode must be True or False, got 'no'"),
    (dict(dedup="false"), r"dedup must be True or False, got 'false'"),
    (dict(learn_log_z="yes"), r"learn_log_z must be True or False, got 'yes'"),
    (dict(grad_clip=True), r"grad_clip must be None \(no clipping\) or a number > 0, got True"),
    (dict(grad_clip=math.inf), r"grad_clip must be None \(no clipping\) or a number > 0, got inf"),
    (dict(beta_schedule=[[0, 0.1], [10, math.inf]]), r"beta_schedule must be \[\[learner_update, beta\], \.\.\.\]"),
    (dict(beta_schedule=[[0, math.nan]]), r"beta_schedule must be"),
    (dict(reward_temperature_schedule=[[0, 2.0], [100, 0]]),
     r"reward_temperature_schedule must be \[\[learner_update, tau\], \.\.\.\] starting at update 0, .* finite tau > 0"),
    (dict(reward_temperature_schedule=2.0), r"reward_temperature_schedule must be"),
    (dict(lora={"rank": 8}), r"lora has unknown peft.LoraConfig argument\(s\) \['rank'\]; common ones: r, lora_alpha"),
    (dict(sample_wait_timeout_s=0), r"sample_wait_timeout_s must be > 0, got 0"),
    (dict(max_new_tokens=True), r"max_new_tokens must be None \(use env_config\) or a positive integer, got True"),
    (dict(training_intensity=-1.0), r"training_intensity must be > 0, got -1.0"),
    (dict(prompts_per_batch=0), r"prompts_per_batch must be >= 1, got 0"),
    (dict(m=math.nan), r"m must be a number, got nan"),
    (dict(lr="1e-5"), r"Invalid `lr` \(1e-5\) specified! Must be a list of 2 or more tuples"),  # RLlib's own check
])
def test_tba_config_rejects(change, message):
    with pytest.raises(ValueError) as info:
        tba_config(**change).validate()
    assert re.search(message, first_line(info.value)), first_line(info.value)


def env(env_id, **config):
    import gymnasium as gym

    import envs  # noqa: F401

    return gym.make(env_id, config={"model": "tiny-test", **config})


@pytest.mark.parametrize("env_id, config, error, message", [
    ("tba/TLDR-v0", {"max_new_token": 8}, ValueError, r"unknown config keys \['max_new_token'\]; allowed: "),
    ("tba/TLDR-v0", {"model": "./no/such/model-dir"}, FileNotFoundError,
     r"model path './no/such/model-dir' does not exist \(embedded names: smollm2-135m-instruct, tiny-test"),
    ("tba/TLDR-v0", {"model": "no-such-org/no-such-model"}, OSError,
     r"model 'no-such-org/no-such-model' could not be loaded: it is not an embedded name"),
    ("tba/TLDR-v0", {"dataset": "/no/such/posts.jsonl"}, OSError, r"/no/such/posts.jsonl"),
    ("tba/TLDR-v0", {"reward_model": "no-such-org/no-such-rm"}, OSError,
     r"reward_model \(use 'standin-rouge1' or an HF sequence-classification model\) 'no-such-org/no-such-rm' could "
     r"not be loaded"),
    ("tba/TLDR-v0", {"on_invalid_reward": "skip"}, ValueError, r"on_invalid_reward must be 'raise' or 'drop', got 'skip'"),
    ("tba/TLDR-v0", {"max_new_tokens": 0}, ValueError, r"max_new_tokens must be a positive integer, got 0"),
    ("tba/Math-v0", {"dataset": "no_such_generator"}, ValueError,
     r"math dataset 'no_such_generator': not an existing .jsonl file and not a usable reasoning-gym dataset"),
    ("tba/RedTeam-v0", {"toxicity": "no-such-scorer", "victim": "tiny-test"}, OSError,
     r"toxicity scorer \(use 'profanity-check' or an HF text-classification model\) 'no-such-scorer' could not be "
     r"loaded"),
    ("tba/RedTeam-v0", {"reward": "accuracy", "victim": "tiny-test"}, ValueError,
     r"reward must be one of 'log_toxicity', 'log_mean_toxicity', 'toxicity', got 'accuracy'"),
    ("tba/RedTeam-v0", {"victim_responses": 0, "victim": "tiny-test"}, ValueError,
     r"victim_responses must be a positive integer, got 0"),
])
def test_env_config_rejects(tiny_model, env_id, config, error, message):
    with pytest.raises(error, match=message) as info:
        env(env_id, **config)
    assert "\n" not in first_line(info.value)


def test_data_files_rejected_with_file_and_line(tiny_model, tmp_path):
    bad_json = tmp_path / "posts.jsonl"
    bad_json.write_text(json.dumps({"post": "a", "summary": "b"}) + "\n{oops\n")
    with pytest.raises(ValueError, match=r"posts.jsonl: line 2 is not valid JSON"):
        env("tba/TLDR-v0", dataset=str(bad_json))
    no_post = tmp_path / "nopost.jsonl"
    no_post.write_text(json.dumps({"text": "a"}) + "\n")
    with pytest.raises(ValueError, match=r"nopost.jsonl: line 1 needs a string 'post'"):
        env("tba/TLDR-v0", dataset=str(no_post))
    math_rows = tmp_path / "gsm.jsonl"
    math_rows.write_text(json.dumps({"question": "1+1?"}) + "\n")
    with pytest.raises(ValueError, match=r"math dataset row 0: expected an object with a string 'question' and an "
                                         r"'answer'"):
        env("tba/Math-v0", dataset=str(math_rows))


def test_damaged_and_missing_checkpoints_are_named(tmp_path):
    from rllib_tba.checkpoint_files import CheckpointError, read_checkpoint_state
    from rllib_tba.policy_export import load_checkpoint_config

    with pytest.raises(CheckpointError, match=r"checkpoint .*nowhere does not exist"):
        read_checkpoint_state(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match=r"is not an RLlib algorithm checkpoint: algorithm_state.pkl is missing"):
        read_checkpoint_state(tmp_path / "empty")
    (tmp_path / "empty" / "algorithm_state.pkl").write_bytes(b"\x80\x04\x95truncated")
    with pytest.raises(CheckpointError, match=r"damaged checkpoint file .*empty/algorithm_state.pkl: "):
        read_checkpoint_state(tmp_path / "empty")
    (tmp_path / "empty" / "class_and_ctor_args.pkl").write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"damaged checkpoint file .*class_and_ctor_args.pkl: EOFError"):
        load_checkpoint_config(tmp_path / "empty")
