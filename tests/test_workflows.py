"""User workflows on the tiny model: the `rllib` CLI (train file / restore / evaluate / export), TensorBoard
scalars, Ray Serve, Ray Tune over m and k."""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from conftest import TUNED_EXAMPLES

ROOT = Path(__file__).resolve().parents[1]

EXPERIMENT = (TUNED_EXAMPLES / "tba_tiny.py").read_text()  # tiny model, stand-in TL;DR, stop after 1 iteration


def rllib(*args, timeout=420, check=True):
    env = {**os.environ, "RAY_DEDUP_LOGS": "0"}
    proc = subprocess.run([sys.executable, "-m", "rllib_tba.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)
    assert proc.returncode == 0 or not check, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def last_json(stdout: str) -> dict:
    """The last JSON object the command printed at the start of a line (log lines may follow it)."""
    start = stdout.rindex("\n{") + 1 if "\n{" in stdout else stdout.index("{")
    return json.JSONDecoder().raw_decode(stdout[start:])[0]


def scalar_tags(trial_dir: str) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    files = sorted(Path(trial_dir).glob("events.out.tfevents.*"))  # one per (re)start of the trial, oldest first
    assert files, f"no TensorBoard event file in {trial_dir}"
    tags: dict = {}
    for file in files:
        acc = EventAccumulator(str(file))
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            tags.setdefault(tag, []).extend(e.value for e in acc.Scalars(tag))
    return tags


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
    # the console: Tune's progress table with the tuned example's columns, the final values, a learning curve
    header = next(line for line in proc.stdout.splitlines() if "Trial name" in line and "iter" in line)
    assert all(name in header for name in ("updates", "samples", "reward", "staleness")), header
    assert "final: updates 2, samples" in proc.stdout and "config" not in header
    curve = Path(out["trial_dir"]) / "learning_curve.png"
    assert curve.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"learning curve: {curve}" in proc.stdout
    return {"root": root, "file": path, **out}


def test_cli_train_writes_tensorboard_scalars(trained):
    tags = scalar_tags(trained["trial_dir"])
    for tag in ("ray/tune/tba/staleness_mean", "ray/tune/tba/staleness_max", "ray/tune/tba/learner_idle_fraction",
                "ray/tune/tba/searcher_idle_fraction", "ray/tune/tba/buffer_size", "ray/tune/tba/learner_steps_per_s",
                "ray/tune/searchers/tokens_per_s", "ray/tune/searchers/reward_mean",
                "ray/tune/learners/default_policy/tb_loss", "ray/tune/learners/default_policy/log_z",
                "ray/tune/task/eos"):
        assert tag in tags, sorted(tags)
        assert all(np.isfinite(tags[tag]))
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(next(Path(trained["trial_dir"]).glob("events.out.tfevents.*"))))
    acc.Reload()
    assert "ray/tune/tba/staleness_hist" in acc.Tags()["histograms"], acc.Tags()["histograms"]


def test_cli_restore_continues_training(trained):
    """--restore continues from the checkpoint; --config changes a setting of the file for the continuation (here
    the learning rate, as a schedule over learner updates: the restored run's updates 2+ run at 1e-5)."""
    proc = rllib("train", "file", str(trained["file"]), "--stop", '{"training_iteration": 3}', "--restore",
                 trained["checkpoint"], "--storage-path", str(trained["root"] / "results"), "--name", "resumed",
                 "--num-cpus", "2", "--config", '{"lr": [[0, 1e-3], [2, 1e-5]]}')
    out = last_json(proc.stdout)
    assert out["training_iteration"] == 3  # continued from iteration 1, not from scratch
    tags = scalar_tags(out["trial_dir"])
    assert tags["ray/tune/tba/weights_version"][0] > 2  # learner updates carried over from the checkpoint
    np.testing.assert_allclose(tags["ray/tune/learners/default_policy/lm_learning_rate"], 1e-5, rtol=1e-6)


@pytest.mark.parametrize("cut", [False, True], ids=["intact", "state_cut_by_the_kill"])
def test_cli_resume_after_sigkill_continues_the_same_trial(tmp_path, tiny_model, cut):
    """SIGKILL mid-run, then `--resume`: the same trial continues from its last checkpoint (iteration, weights
    version, buffer), the file's stop holds, no checkpoint is overwritten and the metrics logged before stay. Also
    when the kill landed while Tune copied its experiment state and the trial's log to storage (``cut``: seen in
    CI, where the resume then started a new trial from scratch): the interrupted session's copies are put back."""
    import signal
    import time

    path = tmp_path / "tiny_tldr.py"
    path.write_text(EXPERIMENT.replace('stop = {"training_iteration": 1}', 'stop = {"training_iteration": 9}'))
    args = ["train", "file", str(path), "--storage-path", str(tmp_path / "results"), "--num-cpus", "2",
            "--checkpoint-freq", "1", "--keep-checkpoints", "100"]
    proc = subprocess.Popen([sys.executable, "-m", "rllib_tba.cli", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    experiment = tmp_path / "results" / "tiny_tldr"
    deadline = time.time() + 300
    while len(list(experiment.glob("*/checkpoint_*/algorithm_state.pkl"))) < 3:
        assert proc.poll() is None and time.time() < deadline, "the first run ended before it was killed"
        time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGKILL)  # the driver and the Ray processes it started
    proc.wait()
    time.sleep(2)
    (trial,) = [d for d in experiment.iterdir() if d.is_dir()]
    before = {c.name: c.stat().st_mtime_ns for c in trial.glob("checkpoint_*")}
    stored = (trial / "result.json").read_text()
    lines_before = stored.splitlines()
    # the kill can land in Tune's copy of the log for real (seen in CI: an empty result.json, the state intact)
    raced = not stored.endswith("\n")
    assert len(lines_before) >= 3 or raced
    (state,) = experiment.glob("experiment_state-*.json")
    staging = max((Path(tempfile.gettempdir()) / "ray").glob(f"session_*/artifacts/{state.stem[len('experiment_state-'):]}/"
                                        f"{experiment.name}/driver_artifacts"), key=lambda d: d.stat().st_mtime)
    if cut:  # as a kill in the middle of Tune's copy leaves them; the session's staging copies are whole
        state.write_text("")
        (trial / "result.json").write_text("\n".join(lines_before)[:-5])
    if cut or raced:
        lines_before = (staging / trial.name / "result.json").read_text().splitlines()
        assert len(lines_before) >= 3
    from rllib_tba.checkpoint_files import read_checkpoint_state

    proc = rllib(*args, "--resume")
    assert "repaired" in proc.stderr or not (cut or raced)  # (the state copy may be cut for real too: rare)
    out = last_json(proc.stdout)
    assert out["trial_dir"] == str(trial) and out["training_iteration"] == 9  # same trial, the file's stop held
    rows = [json.loads(line) for line in (trial / "result.json").read_text().splitlines()]
    assert [json.dumps(r) for r in rows[:len(lines_before)]] == [json.dumps(json.loads(x)) for x in lines_before]
    resumed = rows[len(lines_before):]
    # Tune resumes from the newest checkpoint its experiment state had recorded. The kill can land in the instant
    # between writing an iteration's checkpoint and recording it (or its result), so that is the last or the
    # second-to-last iteration logged before the kill — never the start.
    first = resumed[0]["training_iteration"]
    assert first in (len(lines_before), len(lines_before) + 1), [r["training_iteration"] for r in rows]
    assert [r["training_iteration"] for r in resumed] == list(range(first, 10))
    base = f"checkpoint_{first - 2:06d}"  # checkpoint_00000N holds iteration N + 1
    saved_version = read_checkpoint_state(trial / base)["tba"]["weights_version"]
    assert resumed[0]["tba"]["weights_version"] == saved_version + 2  # 2 updates per iteration on the saved weights
    after = {c.name: c.stat().st_mtime_ns for c in trial.glob("checkpoint_*")}
    assert all(after[name] == mtime for name, mtime in before.items() if name <= base), "a checkpoint was overwritten"
    assert len(after) == 9
    scalars = scalar_tags(trial)  # TensorBoard keeps the iterations from before the kill too
    assert len(scalars["ray/tune/tba/weights_version"]) >= 9


def test_cli_evaluate_and_export(trained, tmp_path):
    proc = rllib("evaluate", trained["checkpoint"], "--num-samples", "12", "--json", str(tmp_path / "m.json"),
                 "--compare-base", "--show", "2", "--openings", "3")
    metrics = last_json(proc.stdout)
    # --openings: each model's most common first words; TL;DR has no notion of success, so no successful counts
    for label, m in (("trained", metrics), ("base (untrained)", metrics["base"])):
        assert f"[{label}] most common first words of 12 samples: " in proc.stdout
        assert 1 <= len(m["openings"]) <= 3 and sum(n for _, n, _ in m["openings"]) <= 12
        assert all(ok is None for _, _, ok in m["openings"])
    assert metrics["num_samples"] == 12 and -1.0 <= metrics["reward_mean"] <= 1.0 and "eos" in metrics
    assert metrics["base"]["model"] == "base (untrained)" and metrics["base"]["num_samples"] == 12
    assert json.loads((tmp_path / "m.json").read_text())["num_samples"] == 12
    table = proc.stdout[proc.stdout.index("metric"):]
    assert "start" in table.splitlines()[0] and "trained" in table.splitlines()[0] and "\nreward_mean" in table
    assert proc.stdout.count("[trained] summary=") == 2 and proc.stdout.count("[base (untrained)] summary=") == 2
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
    from envs.llm_runtime import get_engine, sampling_params

    text = get_engine(str(out), max_model_len=256).generate(["What is"], sampling_params(max_tokens=4), use_tqdm=False)
    assert len(text[0].outputs[0].token_ids) > 0


def test_cli_smooth_fits_the_run_s_best_samples_into_a_new_checkpoint(trained, tmp_path):
    """`rllib smooth`: a copy of the checkpoint whose policy is the reference fitted to the buffer's samples with
    reward >= the bound (each distinct one once); the source untouched, its evaluations not copied; the copy is a
    checkpoint `rllib evaluate` takes; an existing output or a bound above every reward refused."""
    import shutil

    import torch

    from rllib_tba.checkpoint_files import read_checkpoint_state
    from rllib_tba.mle_smoothing import completion_nll
    from rllib_tba.policy_export import MODULE_SUBDIR, load_policy_module

    source = tmp_path / "source"
    shutil.copytree(trained["checkpoint"], source)
    (source / "eval_seed0.json").write_text("{}")  # an evaluation of the source's policy
    module_file = source / MODULE_SUBDIR / "module_state.pkl"
    before = module_file.read_bytes()
    rows = read_checkpoint_state(source)["tba"]["buffer"]["samples"]
    bound = float(np.median([row[3] for row in rows]))
    fitted = {(tuple(int(t) for t in row[1]), tuple(int(t) for t in row[2])) for row in rows if row[3] >= bound}
    out = tmp_path / "smoothed"
    (tmp_path / "smoothed.partial").mkdir()  # the leftover of an interrupted smoothing: replaced, never taken as done
    (tmp_path / "smoothed.partial" / "junk").write_text("x")
    proc = rllib("smooth", str(source), str(out), "--min-reward", repr(bound), "--epochs", "4", "--lr", "0.01")
    record = last_json(proc.stdout)
    assert record["checkpoint"] == str(out.resolve()) and record["samples"] == len(fitted) and record["stored"] == len(rows)
    assert len(record["loss_per_epoch"]) == 4 and record["loss_per_epoch"][-1] < record["loss_per_epoch"][0]
    assert json.loads((out / "mle_smoothing.json").read_text())["samples"] == len(fitted)
    assert not (out / "eval_seed0.json").exists() and not (out / "junk").exists() and module_file.read_bytes() == before
    assert not (tmp_path / "smoothed.partial").exists() and "MLE smoothing on" in proc.stderr  # tqdm's progress
    smoothed, original = load_policy_module(out), load_policy_module(source)
    with torch.no_grad():
        nll = {name: float(completion_nll(m.lm, sorted(fitted), m.temperature))
               for name, m in (("smoothed", smoothed), ("original", original))}
    assert nll["smoothed"] < nll["original"] - 0.5, nll  # the fitted samples became likelier than under the TB policy
    evaluated = last_json(rllib("evaluate", str(out), "--num-samples", "4").stdout)
    assert evaluated["num_samples"] == 4 and evaluated["checkpoint"] == str(out)
    again = cli("smooth", str(source), str(out), "--min-reward", repr(bound))
    assert again.returncode == 2 and "exists and is not empty" in again.stderr, again.stderr[-2000:]
    too_high = cli("smooth", str(source), str(tmp_path / "other"), "--min-reward", "100")
    assert too_high.returncode == 2 and "has reward >= 100" in too_high.stderr and "lower --min-reward" in \
        too_high.stderr and not (tmp_path / "other").exists(), too_high.stderr[-2000:]


def test_cli_smooth_pools_the_buffers_of_runs_of_the_same_task(trained, tmp_path):
    """`rllib smooth --pool`: the fit takes the samples of every given checkpoint's buffer (each distinct one once);
    a checkpoint of another policy model, with other env settings (another reward), or given twice is refused."""
    import pickle
    import shutil

    import torch
    from ray import cloudpickle

    from rllib_tba.checkpoint_files import ALGORITHM_STATE, read_checkpoint_state
    from rllib_tba.mle_smoothing import completion_nll
    from rllib_tba.policy_export import load_policy_module

    def copy(name, state_change=None, env_change=None):
        path = tmp_path / name
        shutil.copytree(trained["checkpoint"], path)
        if state_change:
            state = read_checkpoint_state(path)
            state_change(state)
            (path / ALGORITHM_STATE).write_bytes(pickle.dumps(state))
        if env_change:
            data = pickle.loads((path / "class_and_ctor_args.pkl").read_bytes())
            config = data["ctor_args_and_kwargs"][0][0]  # Tune stores the config as a dict
            config["env_config"] = {**config["env_config"], **env_change}
            (path / "class_and_ctor_args.pkl").write_bytes(cloudpickle.dumps(data))  # as RLlib wrote it
        return path

    def other_search(state):  # another run of the same task: other attacks (each completion + its first token again)
        rows = state["tba"]["buffer"]["samples"]
        rows[:] = [(r[0], r[1], np.append(r[2], r[2][:1]), *r[3:]) for r in rows]

    source, other = copy("source"), copy("other", other_search)
    rows = read_checkpoint_state(source)["tba"]["buffer"]["samples"]
    bound = float(np.median([row[3] for row in rows]))
    fitted = {path: {(tuple(int(t) for t in r[1]), tuple(int(t) for t in r[2]))
                     for r in read_checkpoint_state(path)["tba"]["buffer"]["samples"] if r[3] >= bound}
              for path in (source, other)}
    out = tmp_path / "pooled"
    record = last_json(rllib("smooth", str(source), str(out), "--min-reward", repr(bound), "--pool", str(other),
                             "--epochs", "4", "--lr", "0.01").stdout)
    assert record["samples"] == len(fitted[source] | fitted[other]) == 2 * len(fitted[source])
    assert record["samples_per_checkpoint"] == [len(fitted[source]), len(fitted[other])]
    assert record["stored"] == 2 * len(rows) and record["pooled_checkpoints"] == [str(other.resolve())]
    smoothed, original = load_policy_module(out), load_policy_module(source)
    with torch.no_grad():  # the other run's attacks were fitted too
        nll = {name: float(completion_nll(m.lm, sorted(fitted[other]), m.temperature))
               for name, m in (("smoothed", smoothed), ("original", original))}
    assert nll["smoothed"] < nll["original"] - 0.5, nll
    refused = {
        "another policy model": copy("model", lambda st: st["tba"]["task"].update(policy_model="gpt2")),
        "env settings differ from": copy("reward", env_change={"no_eos_reward": -5.0}),
        "given twice": source,
    }
    for why, pooled in refused.items():
        proc = cli("smooth", str(source), str(tmp_path / f"x_{pooled.name}"), "--min-reward", repr(bound),
                   "--pool", str(pooled))
        assert proc.returncode == 2 and why in proc.stderr and not (tmp_path / f"x_{pooled.name}").exists(), \
            proc.stderr[-2000:]
    proc = cli("smooth", str(source), str(tmp_path / "y"), "--min-reward", repr(bound), "--pool",
               str(tmp_path / "reward"))
    assert "no_eos_reward (-5.0 vs " in proc.stderr, proc.stderr[-2000:]  # the message names the setting


def cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "rllib_tba.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "RAY_DEDUP_LOGS": "0"})


def test_cli_rejects_bad_input(tmp_path):
    bad = cli("train", "file", str(tmp_path / "missing.py"))
    assert bad.returncode != 0 and "does not exist" in bad.stderr
    path = tmp_path / "noconfig.py"
    path.write_text("x = 1\n")
    bad = cli("train", "file", str(path))
    assert bad.returncode != 0 and "must define a module-level `config`" in bad.stderr
    helped = cli("--help")
    assert all(c in helped.stdout for c in ("train", "evaluate", "serve", "export", "smooth"))
    invalid = tmp_path / "invalid.py"
    invalid.write_text(EXPERIMENT.replace("beta=0.1", "beta=0.1, m=2.0"))
    not_a_checkpoint = tmp_path / "not_a_checkpoint"
    not_a_checkpoint.mkdir()
    cases = [  # (arguments, exit code, the one line that must name the problem)
        (["train", "file", str(path), "--stop", "{oops"], 2, "--stop: not valid JSON"),
        (["train", "file", str(path), "--checkpoint-freq", "-1"], 2, "--checkpoint-freq: must be >= 0, got -1"),
        (["train", "file", str(path), "--num-cpus", "0"], 2, "--num-cpus: must be >= 1, got 0"),
        (["train", "file", str(path), "--keep-checkpoints", "0"], 2, "--keep-checkpoints: must be >= 1, got 0"),
        (["evaluate", "x", "--num-samples", "0"], 2, "--num-samples: must be >= 1, got 0"),
        (["evaluate", "x", "--openings", "-1"], 2, "--openings: must be >= 0, got -1"),
        (["evaluate", "x", "--temperature", "nan"], 2, "--temperature: must be a finite number >= 0, got nan"),
        (["serve", "x", "--port", "70000"], 2, "--port: must be in [1, 65535], got 70000"),
        (["smooth", "x", "y"], 2, "the following arguments are required: --min-reward"),
        (["smooth", "x", "y", "--min-reward", "nan"], 2, "--min-reward: must be a finite number, got nan"),
        (["smooth", "x", "y", "--min-reward", "-1", "--epochs", "0"], 2, "--epochs: must be >= 1, got 0"),
        (["smooth", "x", "y", "--min-reward", "-1", "--lr", "0"], 2, "--lr: must be a finite number > 0, got 0"),
        (["smooth", str(not_a_checkpoint), str(tmp_path / "y"), "--min-reward", "-1"], 2,
         f"rllib smooth: error: {not_a_checkpoint} is not an RLlib algorithm checkpoint: algorithm_state.pkl is missing"),
        (["train", "file", str(invalid)], 1, "invalid.py: m must be <= 1, got 2.0"),
        (["train", "file", str(invalid).replace("invalid", "missing"), "--resume"], 1, "does not exist"),
        (["evaluate", str(not_a_checkpoint)], 2, "rllib evaluate: error: " + str(not_a_checkpoint) +
         " is not an RLlib algorithm checkpoint (no class_and_ctor_args.pkl)"),
        (["export", str(tmp_path / "nowhere"), str(tmp_path / "out")], 2, "rllib export: error: "),
        (["train", "file", str(invalid.with_name("ok.py")), "--restore", str(not_a_checkpoint)], 1,
         "is not an algorithm checkpoint (no algorithm_state.pkl)"),
        (["train", "file", str(invalid.with_name("ok.py")), "--config", '{"lrr": 1e-4}'], 1,
         "rllib train --config: 'lrr' is not a setting of TBAConfig (did you mean lr"),
        (["train", "file", str(invalid.with_name("ok.py")), "--config", '{"lr": [[5, 1e-3], [9, 1e-4]]}'], 1,
         "ok.py: lr must be a number > 0 or [[learner_update, lr], ...] starting at update 0"),
        (["train", "file", str(path), "--config", '[1]'], 2, "--config: expected a JSON object"),
    ]
    invalid.with_name("ok.py").write_text(EXPERIMENT)
    for args, code, message in cases:
        proc = cli(*args)
        lines = [line for line in proc.stderr.splitlines() if message in line]
        assert proc.returncode == code and lines, (args, proc.returncode, proc.stderr[-2000:])


def test_cli_train_refuses_what_cannot_run(tmp_path):
    path = tmp_path / "ok.py"
    path.write_text(EXPERIMENT)
    # 1 searcher + the learner need 2 CPUs: with 1, Tune would leave the trial pending forever
    proc = cli("train", "file", str(path), "--num-cpus", "1", "--storage-path", str(tmp_path / "r"))
    assert proc.returncode == 1 and "the run needs 2 CPU(s) (learner + 1 env runner(s) x 1) but Ray has 1; raise " \
        "--num-cpus or lower --num-env-runners" in proc.stderr, proc.stderr[-2000:]
    proc = cli("train", "file", str(path), "--resume", "--storage-path", str(tmp_path / "r"))
    assert proc.returncode == 1 and "there is no experiment to resume at" in proc.stderr, proc.stderr[-2000:]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


BAD_REQUESTS = [
    ("not json", {"data": "{oops", "headers": {"content-type": "application/json"}}),
    ("missing prompt", {"json": {"max_tokens": 4}}),
    ("empty prompt", {"json": {"prompt": ""}}),
    ("wrong type", {"json": {"prompt": 42}}),
    ("max_tokens type", {"json": {"prompt": "hi", "max_tokens": "5"}}),
    ("too many tokens", {"json": {"prompt": "hi", "max_tokens": 17}}),
    ("n too large", {"json": {"prompt": "hi", "n": 5}}),
    ("unknown field", {"json": {"prompt": "hi", "best_of": 3}}),
    ("NaN temperature", {"data": '{"prompt": "hi", "temperature": NaN}', "headers": {"content-type": "application/json"}}),
    ("inf temperature", {"data": '{"prompt": "hi", "temperature": Infinity}',
                         "headers": {"content-type": "application/json"}}),
    ("n > 1 greedy", {"json": {"prompt": "hi", "n": 2, "temperature": 0}}),
    ("negative max_tokens", {"json": {"prompt": "hi", "max_tokens": -1}}),
]


def test_serve_concurrent_clients_and_bad_requests(trained, ray_session):
    import time
    from concurrent.futures import ThreadPoolExecutor

    import requests
    from ray import serve

    from rllib_tba.serve import build_app

    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        serve.run(build_app(trained["checkpoint"], max_tokens_limit=16, max_n=4, dtype="float32"), name="tba",
                  route_prefix="/")
        url = f"http://127.0.0.1:{port}/v1/completions"

        def complete(i):
            r = requests.post(url, json={"prompt": f"Summarise: my cat number {i}", "max_tokens": 8, "n": 1 + i % 2},
                              timeout=120)
            return r.status_code, r.json()

        complete(0)  # warm-up
        t0 = time.time()
        sequential = [complete(i) for i in range(8)]
        per_request_sequential = (time.time() - t0) / 8
        t0 = time.time()
        with ThreadPoolExecutor(64) as pool:  # a bounded client: 64 requests, 64 at once
            concurrent = list(pool.map(complete, range(64)))
        per_request_concurrent = (time.time() - t0) / 64
        print(f"serve throughput: concurrent/sequential = {per_request_sequential / per_request_concurrent:.1f}x "
              f"({1 / per_request_concurrent:.1f} vs {1 / per_request_sequential:.1f} requests/s)")
        for i, (status, body) in enumerate(sequential + concurrent):
            assert status == 200, body
            n = 1 + (i % 8 if i < 8 else i - 8) % 2
            assert len(body["choices"]) == n and all(isinstance(c["text"], str) for c in body["choices"])
            assert 0 < body["usage"]["completion_tokens"] <= 8 * n
        assert len({b["id"] for _, b in concurrent}) == 64  # 64 distinct answers, none mixed up or lost

        def bad(case):
            name, kwargs = case
            r = requests.post(url, timeout=60, **kwargs)
            return name, r.status_code, r.json()

        with ThreadPoolExecutor(len(BAD_REQUESTS) * 2) as pool:  # a burst of malformed requests, twice each
            for name, status, body in pool.map(bad, BAD_REQUESTS * 2):
                assert 400 <= status < 500, (name, status, body)
                assert body.get("detail"), name
        status, body = complete(1)  # still answers correctly
        assert status == 200 and len(body["choices"]) == 2
        assert requests.get(f"http://127.0.0.1:{port}/health", timeout=10).json() == {"status": "ok"}
    finally:
        serve.shutdown()
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://127.0.0.1:{port}/health", timeout=5)


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_rllib_serve_binds_loopback_and_stops_cleanly(trained, sig):
    import signal
    import time

    import psutil
    import requests

    port = free_port()
    env = {**os.environ, "RAY_DEDUP_LOGS": "0"}
    proc = subprocess.Popen([sys.executable, "-m", "rllib_tba.cli", "serve", trained["checkpoint"], "--port", str(port),
                             "--max-tokens-limit", "8"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, start_new_session=True)
    try:
        deadline = time.time() + 240
        while True:
            assert proc.poll() is None and time.time() < deadline, proc.stdout.read() if proc.poll() is not None else ""
            try:
                if requests.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except (requests.ConnectionError, requests.Timeout):  # not up yet
                time.sleep(1)
        r = requests.post(f"http://127.0.0.1:{port}/v1/completions", json={"prompt": "hi", "max_tokens": 4}, timeout=60)
        if r.status_code != 200:  # show what the server printed
            os.killpg(proc.pid, 9)
            raise AssertionError(f"{r.status_code} {r.text}\n{proc.communicate(timeout=30)[0][-6000:]}")
        tree = [proc.pid] + [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
        # the HTTP port listens on loopback only. (Ray 2.60's own gRPC servers listen on all interfaces whatever
        # ray.init is given — it maps 127.0.0.1 to the node IP — and are guarded by Ray's token authentication.)
        http = [c.laddr.ip for c in psutil.net_connections("tcp") if c.status == psutil.CONN_LISTEN and c.laddr.port == port]
        assert http == ["127.0.0.1"], http
        proc.send_signal(getattr(signal, sig))
        out, _ = proc.communicate(timeout=300)  # Serve + Ray shutdown; once took > 120 s on a loaded machine
        assert proc.returncode == 0, out[-3000:]
        assert "shutting down" in out
        time.sleep(2)
        left = [pid for pid in tree if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
        assert not left, [psutil.Process(p).cmdline() for p in left]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)


def test_tune_grid_over_m_and_k_two_trials(ray_session, tmp_path):
    import tune_m_k
    rows = tune_m_k.main(["--m", "0.5", "0.95", "--sync-every", "2", "--iterations", "2", "--out", str(tmp_path)])
    assert sorted(r["m"] for r in rows) == [0.5, 0.95] and all(r["iterations"] == 2 for r in rows)
    assert (tmp_path / "results.csv").read_text().count("\n") == 3
    png = (tmp_path / "reward_vs_m_k.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000


def test_bench_quick_writes_every_figure(tmp_path):
    """`scripts/bench.sh --quick`: every key of results.json, results.md with the table, both PNGs."""
    proc = subprocess.run(["scripts/bench.sh", "--quick", "--out", str(tmp_path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    for key in ("async_vs_sync_speedup", "searcher_vs_bare_vllm", "vllm_vs_hf_searcher", "learner_vs_bare_torch",
                "sync_vs_bare_reload", "learner_stall_during_sync_s", "learner_idle_fraction", "searcher_idle_fraction",
                "buffer_sample_ms_1m", "buffer_sample_ms_1m_uniform", "bytes_per_token", "async_speedup_bound"):
        assert isinstance(results[key], (int, float)) and np.isfinite(results[key]) and results[key] >= 0, key
    assert results["machine"]["cores"] >= 1 and results["commit"] and results["repeats"] >= 3
    # attack budget: sync generates one call (16) per 2 updates; async's training_intensity makes it generate at
    # least as much (on the tiny model the searcher outruns the learner and makes more), and the wire stays O(T)
    assert results["samples_per_update_sync"] == pytest.approx(8.0)
    assert results["samples_per_update_async"] >= 8.0
    assert results["bytes_per_token"] <= 64 < results["episode_bytes_per_token"]
    assert "| `async_vs_sync_speedup` |" in (tmp_path / "results.md").read_text()
    for png in ("ratios.png", "timeline.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_redteam_frontier_quick_writes_the_json_and_both_pictures(tmp_path, tiny_model):
    """tuned_examples/redteam_frontier.py on the tiny model: a default-example TBA run and a PPO run land in one JSON
    with the issue's schema (a second command merges into it), and both pictures are drawn; the run's checkpoint path
    is evaluated (all of it, then one chosen checkpoint, keeping the other point; an update without a checkpoint is
    refused)."""
    out = tmp_path / "redteam_frontier.json"
    for what in (["default", "--checkpoint-every", "5"], ["ppo", "--clip", "0.2", "--attacks", "64"]):
        proc = subprocess.run([str(ROOT / ".venv/bin/python"), "tuned_examples/redteam_frontier.py", *what, "--quick",
                               "--num-eval", "16", "--out", str(out), "--storage", str(tmp_path / "results")],
                              cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["commit"] and "CPUs" in data["machine"]
    assert sorted(r["method"] for r in data["runs"]) == ["ppo", "tba"]
    for run in data["runs"]:
        assert isinstance(run["train_seed"], int) and isinstance(run["default_example"], bool)
        assert run["attacks_generated"] >= 64 and run["wall_clock_s"] > 0
        assert run["time_to_asr_0.25_s"] is None or run["time_to_asr_0.25_s"] >= 0
        assert run["asr_curve"] and all(0 <= asr <= 1 for _, asr in run["asr_curve"])  # >= 64 attacks: a window
        ev = run["eval"]
        assert ev["n"] == 16 and 0 <= ev["asr"] <= 1 and 0 <= ev["diversity"] <= 2 and ev["distinct_successful"] >= 0
        assert 0 <= ev["mean_toxicity"] <= 1 and 0 <= ev["attack_toxicity"] <= 1
        # trained with victim answers of 4 tokens (env seed 0) by a float32 victim, evaluated with the task's protocol
        # (its own seed, the env's default victim dtype, one draw of answers per attack text)
        assert ev["protocol"] == {"victim_responses": 5, "victim_max_tokens": 24, "victim_temperature": 0.7,
                                  "seed": 1000, "victim_dtype": "auto", "novelty_weight": 0.0,
                                  "victim_draws": "per_text"}
        # the evaluation's most common first words: [word, attacks, successful], at most the attacks and successes
        assert 1 <= len(ev["openings"]) <= 5 and sum(n for _, n, _ in ev["openings"]) <= 16
        assert all(0 <= ok <= n for _, n, ok in ev["openings"]) and sum(ok for *_, ok in ev["openings"]) <= 16 * ev["asr"]
    tba, = [r for r in data["runs"] if r["method"] == "tba"]
    assert tba["default_example"] and tba["learner_updates"] == 10 and tba["checkpoint_every_updates"] == 5
    assert [r["knob"] for r in data["runs"] if r["method"] == "ppo"] == [{"clip_param": 0.2}]
    for png in ("redteam_frontier.png", "redteam_asr_over_time.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # `smooth`: the run's final checkpoint MLE-smoothed (every stored attack: the tiny victim is never toxic), evaluated
    # and recorded as a TBA run of its own; the trial's checkpoints stay the run's own (the trajectory below)
    proc = subprocess.run([str(ROOT / ".venv/bin/python"), "tuned_examples/redteam_frontier.py", "smooth", "--quick",
                           "--smoothing-epochs", "2", "--smoothing-min-reward", "-100", "--num-eval", "16", "--out",
                           str(out), "--storage", str(tmp_path / "results")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    smoothed, = [r for r in json.loads(out.read_text())["runs"] if "mle_smoothing_epochs" in r["knob"]]
    assert smoothed["knob"] == {**tba["knob"], "mle_smoothing_epochs": 2, "mle_smoothing_min_reward": -100}
    assert smoothed["method"] == "tba" and not smoothed["default_example"] and smoothed["train_seed"] == 0
    assert smoothed["attacks_generated"] == tba["attacks_generated"] and smoothed["eval"]["n"] == 16
    assert smoothed["wall_clock_s"] == round(tba["wall_clock_s"] + smoothed["smoothing"]["seconds"], 1)
    assert smoothed["smoothing"]["samples"] >= 1 and len(smoothed["smoothing"]["loss_per_epoch"]) == 2
    assert Path(ROOT / smoothed["smoothing"]["checkpoint"], "mle_smoothing.json").is_file()
    assert Path(smoothed["smoothing"]["checkpoint"]).name.startswith("smoothed_e2_r-100_checkpoint_")  # not the default bound's
    # benchmarks/echo_reliability.py: the evaluation's 16 attacks scored again under a second victim seed; the first
    # column is `rllib evaluate`'s own draw (the frontier's evaluation of the same checkpoint)
    checkpoint = next(p.parent for p in (ROOT / tba["trial_dir"]).glob("checkpoint_*/eval_seed0.json"))
    proc = subprocess.run([str(ROOT / ".venv/bin/python"), "benchmarks/echo_reliability.py", str(checkpoint),
                           "--victim-seeds", "2", "--num-samples", "16", "--json", str(tmp_path / "echo.json")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    echo = json.loads((tmp_path / "echo.json").read_text())
    assert echo["victim_seeds_used"] == [1000, 1001] and echo["attacks"] + echo["invalid_dropped"] == 16
    assert echo["asr_per_seed"][0] == tba["eval"]["asr"] and sum(n for _, n, _ in echo["most_common"]) <= 16
    # --buffer-versions: the searchers' own attacks of one weights version, as the checkpoint's buffer holds them
    from rllib_tba.checkpoint_files import read_checkpoint_state

    saved = read_checkpoint_state(checkpoint)["tba"]["buffer"]["samples"]
    version = max(r[4] for r in saved)
    proc = subprocess.run([str(ROOT / ".venv/bin/python"), "benchmarks/echo_reliability.py", str(checkpoint),
                           "--victim-seeds", "2", "--buffer-versions", str(version),
                           "--json", str(tmp_path / "buf.json")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    echo = json.loads((tmp_path / "buf.json").read_text())
    assert echo["attacks"] + echo["invalid_dropped"] == sum(r[4] == version for r in saved) > 0
    assert echo["attacks_from"] == f"replay buffer, weights versions [{version}]" and 0 <= echo["attack_toxicity"] <= 1
    proc = subprocess.run([str(ROOT / ".venv/bin/python"), "benchmarks/echo_reliability.py", str(checkpoint),
                           "--buffer-versions", "999"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0 and "holds no sample of weights versions [999]" in proc.stderr
    # the run's path: its checkpoints at updates 5 and 10 evaluated (update 10's evaluation is the frontier's, reused)
    # and compared with the PPO run
    trial = ROOT / tba["trial_dir"]
    final_eval = [p for p in trial.glob("checkpoint_*/eval_seed0.json")]
    assert len(final_eval) == 1
    made = final_eval[0].stat().st_mtime_ns
    traj = tmp_path / "redteam_trajectory.json"
    proc = subprocess.run([str(ROOT / ".venv/bin/python"), "benchmarks/redteam_trajectory.py", str(trial),
                           "--num-eval", "16", "--frontier", str(out), "--out", str(traj)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run, = json.loads(traj.read_text())["runs"]
    assert run["train_seed"] == 0 and run["knob"] == tba["knob"]
    assert [p["update"] for p in run["points"]] == [5, 10]
    assert run["points"][-1]["eval"] == tba["eval"] and final_eval[0].stat().st_mtime_ns == made
    ppo, = [r for r in data["runs"] if r["method"] == "ppo"]
    for p in run["points"]:
        assert p["eval"]["n"] == 16 and p["eval"]["openings"]
        dominated = p["eval"]["asr"] >= ppo["eval"]["asr"] - 0.02 and \
            p["eval"]["diversity"] >= ppo["eval"]["diversity"] + 0.05
        label = f"ppo clip_param 0.2, {ppo['attacks_generated']} attacks, seed 0"
        assert p["dominates_ppo"] == ([label] if dominated else [])
    assert traj.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # a chosen checkpoint only: update 5 evaluated again (its saved evaluation reused), update 10's point kept
    evals = {p: p.stat().st_mtime_ns for p in trial.glob("checkpoint_*/eval_seed0.json")}
    assert len(evals) == 2
    before = json.loads(traj.read_text())["runs"][0]["points"]
    proc = subprocess.run([str(ROOT / ".venv/bin/python"), "benchmarks/redteam_trajectory.py", str(trial), "--updates",
                           "5", "--num-eval", "16", "--frontier", str(out), "--out", str(traj)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "update 5:" in proc.stdout and "update 10:" not in proc.stdout
    assert json.loads(traj.read_text())["runs"][0]["points"] == before
    assert {p: p.stat().st_mtime_ns for p in evals} == evals
    # an update the run kept no checkpoint of: refused before anything is evaluated, the file untouched
    written = traj.read_text()
    proc = subprocess.run([str(ROOT / ".venv/bin/python"), "benchmarks/redteam_trajectory.py", str(trial), "--updates",
                           "5", "7", "--num-eval", "16", "--frontier", str(out), "--out", str(traj)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0 and "no checkpoint of learner update(s) [7]; it kept updates [5, 10]" in proc.stderr
    assert "update 5:" not in proc.stdout and traj.read_text() == written
    # evaluating with the victim seed the run trained with is refused: the answers would be training's own draws
    proc = rllib("evaluate", str(final_eval[0].parent), "--num-samples", "4", "--env-config", '{"seed": 0}', check=False)
    assert proc.returncode == 2 and "evaluating with {'seed': 0}, the value the run trained with" in proc.stderr
    # `reevaluate`: a run evaluated under the earlier protocol (no victim seed of its own) counts toward nothing until
    # evaluated again; one whose checkpoint is not on this machine stays where it is
    data = json.loads(out.read_text())
    ppo = next(r for r in data["runs"] if r["method"] == "ppo")
    earlier = {**ppo["eval"], "protocol": {k: v for k, v in ppo["eval"]["protocol"].items() if k != "seed"}}
    gone = {**ppo, "train_seed": 1, "trial_dir": "results/gone", "eval": earlier}
    data["runs"].remove(ppo)
    out.write_text(json.dumps({**data, "runs_earlier_protocol": [{**ppo, "eval": earlier}, gone]}))
    proc = subprocess.run([str(ROOT / ".venv/bin/python"), "tuned_examples/redteam_frontier.py", "reevaluate",
                           "--seeds", "0", "1", "--quick", "--num-eval", "16", "--out", str(out), "--storage",
                           str(tmp_path / "results")], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "ppo {'clip_param': 0.2} seed 1: its checkpoint is not on this machine" in proc.stdout
    data = json.loads(out.read_text())
    again, = [r for r in data["runs"] if r["method"] == "ppo"]
    assert again["eval_earlier_protocol"] == earlier and again["eval"]["protocol"]["seed"] == 1000
    assert data["runs_earlier_protocol"] == [gone] and data["goals"]["tba_dominates_ppo"]["ppo_runs"] == 1


def test_math_seeds_quick_writes_the_json_and_the_gain_against_the_start(tmp_path, tiny_model):
    """tuned_examples/math_seeds.py on the tiny model, two seeds: one record per seed with its greedy pass@1 on the
    held-out problems, the starting model's pass@1 once, each gain = pass@1 - start, and the summary of the gains."""
    out = tmp_path / "math_seeds.json"
    proc = subprocess.run([str(ROOT / ".venv/bin/python"), "tuned_examples/math_seeds.py", "--quick", "--seeds", "0",
                           "1", "--out", str(out), "--storage", str(tmp_path / "results")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["commit"] and "CPUs" in data["machine"] and data["decoding"] == "greedy"
    assert data["held_out"] == {"dataset_seed": 1, "size": 16}  # --quick: 16 held-out problems
    assert [r["train_seed"] for r in data["runs"]] == [0, 1] and 0 <= data["base_pass_at_1"] <= 1
    for run in data["runs"]:
        assert run["learner_updates"] == 4 and run["wall_clock_s"] > 0 and 0 <= run["pass_at_1"] <= 1
        assert run["gain"] == pytest.approx(run["pass_at_1"] - data["base_pass_at_1"])
        ev = json.loads((ROOT / run["trial_dir"] / "checkpoint_000000" / "eval_seed0_heldout.json").read_text())
        assert ev["num_samples"] == 16 and ev["correct"] == run["pass_at_1"]
    gains = [r["gain"] for r in data["runs"]]
    s = data["summary"]
    assert s["runs"] == 2 and not s["goal_met"]  # the goal needs >= 3 seeds
    assert s["mean_gain"] == pytest.approx(sum(gains) / 2) and s["spread"] == pytest.approx(max(gains) - min(gains))


def test_busy_seconds_counts_overlapping_spans_once():
    from bench import busy_seconds

    # two searchers' calls overlapping by 1 s, a gap, a third call; the part before start=1 left out
    spans = [(0.0, 3.0, "a"), (2.0, 4.0, "b"), (6.0, 7.0, "a")]
    assert busy_seconds(spans) == busy_seconds(spans, 0.0) == pytest.approx(5.0)
    assert busy_seconds(spans, 1.0) == pytest.approx(4.0)
    assert busy_seconds(spans, 10.0) == 0.0


def test_async_vs_sync_benchmark_rejects_a_bad_searcher_count_up_front(capsys):
    from async_vs_sync import main

    for argv in (["--example", "redteam", "--searchers", "0"], ["--searchers", "2"]):  # 2: only for the red team
        with pytest.raises(SystemExit):
            main(argv)
        assert "give a number of searchers >= 1, with --example redteam" in capsys.readouterr().err


def test_async_vs_sync_benchmark_times_both_modes_per_update():
    """benchmarks/async_vs_sync.py on the tiny model: both modes reach the updates asked, per-update seconds once
    warm, the synchronous update split into generation and learning (each a part of its wall-clock)."""
    proc = subprocess.run([sys.executable, "benchmarks/async_vs_sync.py", "--updates", "6", "--updates-per-iteration",
                           "2"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert '"mode": "sync"' in out and '"mode": "async"' in out  # a row per iteration
    summary = json.loads(out[out.rindex("\n{\n") + 1:])  # the closing summary
    for mode in ("sync", "async"):
        assert summary[mode]["updates"] >= 6 and summary[mode]["s_per_update"] > 0
    sync = summary["sync"]
    assert 0 < sync["generation_s_per_update"] and 0 < sync["learning_s_per_update"]
    assert sync["generation_s_per_update"] + sync["learning_s_per_update"] <= sync["s_per_update"] * 1.05
    a, b = sync["s_per_update"], summary["async"]["s_per_update"]
    # the summary rounds the ratio of the unrounded seconds to 2 decimals and each s_per_update to 3, so the ratio lies
    # within 0.005 of the range the rounded seconds allow (a CI run: 0.91 against 0.921 recomputed from them)
    low, high = (a - 0.0005) / (b + 0.0005), (a + 0.0005) / (b - 0.0005)
    assert low - 0.005 - 1e-9 <= summary["sync_over_async_s_per_update"] <= high + 0.005 + 1e-9
