"""User workflows on the tiny model: the `rllib` CLI (train file / restore / evaluate / export), TensorBoard
scalars, Ray Serve, Ray Tune over m and k."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

EXPERIMENT = textwrap.dedent('''
    from rllib_tba import TBAConfig

    config = (
        TBAConfig()
        .environment("tba/TLDR-v0")
        .training(policy_model="tiny-test", max_new_tokens=6, lr=1e-3, beta=0.1, prompts_per_batch=2,
                  num_samples_per_prompt=4, samples_per_prompt=4, prompts_per_sample=2, min_buffer_size=8,
                  sync_every=1, searcher_dtype="float32", updates_per_iteration=2, training_intensity=4.0)
        .env_runners(num_env_runners=1)
        .debugging(seed=0)
    )
    stop = {"training_iteration": 1}
''')


def rllib(*args, timeout=420):
    env = {**os.environ, "RAY_DEDUP_LOGS": "0"}
    proc = subprocess.run([sys.executable, "-m", "rllib_tba.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def last_json(stdout: str) -> dict:
    """The last JSON object the command printed at the start of a line (log lines may follow it)."""
    start = stdout.rindex("\n{") + 1 if "\n{" in stdout else stdout.index("{")
    return json.JSONDecoder().raw_decode(stdout[start:])[0]


def scalar_tags(trial_dir: str) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    files = list(Path(trial_dir).glob("events.out.tfevents.*"))
    assert files, f"no TensorBoard event file in {trial_dir}"
    acc = EventAccumulator(str(files[0]))
    acc.Reload()
    return {tag: [e.value for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_model):
    """`rllib train file` with the file's own stop (1 iteration), checkpoint at end."""
    root = tmp_path_factory.mktemp("cli")
    path = root / "tiny_tldr.py"
    path.write_text(EXPERIMENT)
    proc = rllib("train", "file", str(path), "--storage-path", str(root / "results"), "--num-cpus", "2")
    out = last_json(proc.stdout)
    assert out["training_iteration"] == 1  # the file's stop held (the old CLI's default {} would run forever)
    assert out["checkpoint"] and Path(out["checkpoint"]).is_dir()
    assert "Trial status" in proc.stdout + proc.stderr  # Tune's progress table
    return {"root": root, "file": path, **out}


def test_cli_train_writes_tensorboard_scalars(trained):
    tags = scalar_tags(trained["trial_dir"])
    for tag in ("ray/tune/tba/staleness_mean", "ray/tune/tba/buffer_size", "ray/tune/tba/learner_steps_per_s",
                "ray/tune/searchers/tokens_per_s", "ray/tune/searchers/reward_mean",
                "ray/tune/learners/default_policy/tb_loss", "ray/tune/learners/default_policy/log_z",
                "ray/tune/task/eos"):
        assert tag in tags, sorted(tags)
        assert all(np.isfinite(tags[tag]))


def test_cli_restore_continues_training(trained):
    proc = rllib("train", "file", str(trained["file"]), "--stop", '{"training_iteration": 3}', "--restore",
                 trained["checkpoint"], "--storage-path", str(trained["root"] / "results"), "--name", "resumed",
                 "--num-cpus", "2")
    out = last_json(proc.stdout)
    assert out["training_iteration"] == 3  # continued from iteration 1, not from scratch
    tags = scalar_tags(out["trial_dir"])
    assert tags["ray/tune/tba/weights_version"][0] > 2  # learner updates carried over from the checkpoint


def test_cli_evaluate_and_export(trained, tmp_path):
    proc = rllib("evaluate", trained["checkpoint"], "--num-samples", "12", "--json", str(tmp_path / "m.json"))
    metrics = last_json(proc.stdout)
    assert metrics["num_samples"] == 12 and -1.0 <= metrics["reward_mean"] <= 1.0 and "eos" in metrics
    assert json.loads((tmp_path / "m.json").read_text())["num_samples"] == 12
    # the run's starting model on the same task, with an env_config override (a harsher no-EOS penalty): the
    # untrained tiny model almost never stops, so its mean reward sits near the new penalty
    proc = rllib("evaluate", trained["checkpoint"], "--num-samples", "12", "--base-model",
                 "--env-config", '{"no_eos_reward": -5.0}')
    base = last_json(proc.stdout)
    assert base["model"] == "base (untrained)" and base["reward_mean"] < -3.0
    # an env_config override of max_new_tokens wins over the TBAConfig setting stored in the checkpoint
    from rllib_tba.policy_export import load_checkpoint_config, with_env_overrides
    from rllib_tba.vllm_env_runner import make_task_env

    config = load_checkpoint_config(trained["checkpoint"])
    assert make_task_env(config).max_new_tokens != 3
    assert make_task_env(with_env_overrides(config, {"max_new_tokens": 3})).max_new_tokens == 3

    out = tmp_path / "hf"
    rllib("export", trained["checkpoint"], str(out))
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rllib_tba.policy_export import load_policy_module

    model = AutoModelForCausalLM.from_pretrained(out)
    AutoTokenizer.from_pretrained(out)
    module = load_policy_module(trained["checkpoint"])
    ids = torch.tensor([[5, 9, 33, 7]])
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, module.lm(ids).logits)
    from envs.llm_engine import get_engine, sampling_params

    text = get_engine(str(out), max_model_len=256).generate(["What is"], sampling_params(max_tokens=4), use_tqdm=False)
    assert len(text[0].outputs[0].token_ids) > 0


def test_cli_rejects_bad_input(tmp_path):
    bad = subprocess.run([sys.executable, "-m", "rllib_tba.cli", "train", "file", str(tmp_path / "missing.py")],
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "does not exist" in bad.stderr
    path = tmp_path / "noconfig.py"
    path.write_text("x = 1\n")
    bad = subprocess.run([sys.executable, "-m", "rllib_tba.cli", "train", "file", str(path)], capture_output=True, text=True)
    assert bad.returncode != 0 and "must define a module-level `config`" in bad.stderr
    bad = subprocess.run([sys.executable, "-m", "rllib_tba.cli", "train", "file", str(path), "--stop", "{oops"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "not valid JSON" in bad.stderr
    helped = subprocess.run([sys.executable, "-m", "rllib_tba.cli", "--help"], capture_output=True, text=True)
    assert all(c in helped.stdout for c in ("train", "evaluate", "serve", "export"))


def test_serve_end_to_end(trained, ray_session):
    import socket

    import requests
    from ray import serve

    from rllib_tba.serve import build_app

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        serve.run(build_app(trained["checkpoint"], max_tokens_limit=16, max_n=4, dtype="float32"), name="tba",
                  route_prefix="/")
        url = f"http://127.0.0.1:{port}/v1/completions"
        ok = requests.post(url, json={"prompt": "Summarise: my cat", "max_tokens": 5, "n": 2}, timeout=60)
        assert ok.status_code == 200, ok.text
        body = ok.json()
        assert len(body["choices"]) == 2 and all(isinstance(c["text"], str) for c in body["choices"])
        assert 0 < body["usage"]["completion_tokens"] <= 10
        bad_requests = [
            ("not json", {"data": "{oops", "headers": {"content-type": "application/json"}}),
            ("missing prompt", {"json": {"max_tokens": 4}}),
            ("empty prompt", {"json": {"prompt": ""}}),
            ("wrong type", {"json": {"prompt": 42}}),
            ("max_tokens type", {"json": {"prompt": "hi", "max_tokens": "5"}}),
            ("too many tokens", {"json": {"prompt": "hi", "max_tokens": 17}}),
            ("n too large", {"json": {"prompt": "hi", "n": 5}}),
            ("unknown field", {"json": {"prompt": "hi", "best_of": 3}}),
        ]
        for name, kwargs in bad_requests:
            r = requests.post(url, timeout=30, **kwargs)
            assert 400 <= r.status_code < 500, (name, r.status_code, r.text)
            assert r.json().get("detail"), name
        assert requests.post(url, json={"prompt": "still up?", "max_tokens": 2}, timeout=60).status_code == 200
        assert requests.get(f"http://127.0.0.1:{port}/health", timeout=10).json() == {"status": "ok"}
    finally:
        serve.shutdown()
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://127.0.0.1:{port}/health", timeout=5)


def test_tune_grid_over_m_and_k_two_trials(ray_session, tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tuned_examples"))
    try:
        import tune_m_k
    finally:
        sys.path.pop(0)
    rows = tune_m_k.main(["--m", "0.5", "0.95", "--k", "2", "--iterations", "2", "--out", str(tmp_path)])
    assert sorted(r["m"] for r in rows) == [0.5, 0.95] and all(r["iterations"] == 2 for r in rows)
    assert (tmp_path / "results.csv").read_text().count("\n") == 3
    png = (tmp_path / "reward_vs_m_k.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
