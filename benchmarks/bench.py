"""rllib-tba's performance, measured side by side in one run: ratios, never absolute times across runs.

    scripts/bench.sh              # the SmolLM2 red-team tuned example (~20 min on 2 cores)
    scripts/bench.sh --quick      # the tiny model, small buffer (< 3 min): checks that every figure is produced

Writes ``results.json``, ``results.md`` and two PNGs into ``--out`` (default ``benchmarks/``) and, for a full run,
README's performance table (between the ``bench-table`` markers). Every ratio is the median of ``--repeats``
side-by-side repeats. What each key measures (docs/performance.md has the details):

- ``async_vs_sync_speedup``: seconds per learner update, synchronous ÷ asynchronous TBA, same config, same learner
  updates and the same attacks per update (``training_intensity`` in async = what sync generates per update).
- ``searcher_vs_bare_vllm``: a searcher's generation tokens/s (``VLLMEnvRunner.generate`` without the task's
  scoring) ÷ bare ``vllm.LLM.generate`` tokens/s on the same engine, prompts and sampling parameters.
- ``vllm_vs_hf_searcher``: the searcher's tokens/s ÷ Hugging Face ``generate`` (sampling, log-probs) tokens/s.
- ``learner_vs_bare_torch``: bare torch (forward, reference forward, TB loss, backward, clip, AdamW step) seconds ÷
  the TB Learner's ``update`` seconds, same batch and model.
- ``sync_vs_bare_reload``: a full weight sync (learner state → object store → searcher ``reload_weights`` +
  prefix-cache reset) ÷ bare ``reload_weights`` of ready tensors inside the searcher.
- ``learner_stall_during_sync_s``: seconds an asynchronous weight push holds the learner up.
- ``learner_idle_fraction`` / ``searcher_idle_fraction``: asynchronous TBA once the buffer is warm.
- ``buffer_sample_ms_1m`` / ``_uniform``: one draw of 4 prompts × 8 from 1M samples in ONE prompt group.
- ``bytes_per_token``: a searcher's pickled result per generated token.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import pickle
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tuned_examples"))

GOALS = {  # key: (comparison, goal)
    "async_vs_sync_speedup": (">=", 1.6),
    "searcher_vs_bare_vllm": (">=", 0.9),
    "learner_vs_bare_torch": (">=", 0.9),
    "sync_vs_bare_reload": ("<=", 1.5),
    "learner_idle_fraction": ("<=", 0.10),
    "buffer_sample_ms_1m": ("<=", 5.0),
    "bytes_per_token": ("<=", 64),
}


def median(xs) -> float:
    return float(np.median(np.asarray(xs, dtype=float)))


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---- the replay buffer ------------------------------------------------------------------------------------------
def bench_buffer(num_samples: int, repeats: int) -> dict:
    from rllib_tba.tba_replay_buffer import TBAReplayBuffer, TBSample

    rng = np.random.default_rng(0)
    buf = TBAReplayBuffer(capacity=num_samples, per_prompt_capacity=num_samples, dedup=False, seed=0)
    completion = np.zeros(20, np.int32)
    rewards = rng.normal(size=num_samples)
    buf.add(TBSample(0, (1, 2, 3), completion, float(r), 0) for r in rewards)
    out = {"buffer_samples": num_samples}
    for key, inv_temp in (("buffer_sample_ms_1m", 1.0), ("buffer_sample_ms_1m_uniform", 0.0)):
        buf.sample(4, 8, m=0.0, reward_inv_temp=inv_temp)  # builds the sum tree for this temperature
        times = []
        for _ in range(max(repeats, 50)):
            t = time.perf_counter()
            buf.sample(4, 8, m=0.0, reward_inv_temp=inv_temp)
            times.append((time.perf_counter() - t) * 1e3)
        out[key] = median(times)
    return out


# ---- inside the searcher actor (pickled by value: this file runs as __main__) --------------------------------------
def searcher_timings(runner, repeats: int) -> dict:
    """Runner generation vs bare vLLM on the same engine, prompts and parameters; bytes per token; bare reload."""
    import torch

    from envs.llm_runtime import generate_from_ids, sampling_params, sequence_logprobs

    env, s = runner.env, runner.settings
    rows = []
    for _ in range(repeats):
        batch = runner.generate()
        stats = runner._stats
        runner_s = stats["sample_end"] - stats["sample_start"] - stats["score_s"]
        prompts = [batch.prompt_ids[k].tolist() for k in dict.fromkeys(batch.prompt_index.tolist())]
        params = sampling_params(n=s["generations_per_prompt"], temperature=s["temperature"],
                                 max_tokens=env.max_new_tokens, logprobs=0, stop_token_ids=sorted(env.eos_token_ids))
        t = time.perf_counter()
        outs = generate_from_ids(runner.engine, prompts, params)
        bare_s = time.perf_counter() - t
        bare_tokens = sum(len(c.token_ids) for o in outs for c in o.outputs)
        t = time.perf_counter()  # what ref_logp_on="searchers" adds to a generation call
        sequence_logprobs(runner.reference_engine, [batch.prompt_ids[int(k)] for k in batch.prompt_index],
                          [batch.response(i) for i in range(len(batch))])
        ref_s = time.perf_counter() - t
        rows.append({"runner_tokens_per_s": batch.num_tokens / runner_s, "bare_tokens_per_s": bare_tokens / bare_s,
                     "ref_logp_s_per_sample": ref_s / len(batch),
                     "samples_per_s": len(batch) / (stats["sample_end"] - stats["sample_start"]),  # with scoring
                     "tokens_per_sample": batch.num_tokens / len(batch),
                     "bytes_per_token": len(pickle.dumps(batch.without_infos())) / batch.num_tokens,
                     "episode_bytes_per_token": len(pickle.dumps(runner.to_episodes(batch))) / batch.num_tokens,
                     "score_s": stats["score_s"], "generate_s": runner_s})
    # bare reload: the model's weights as ready torch tensors (the HF checkpoint), loaded into the engine
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(env.model_path, dtype=torch.float32)
    weights = {k: v.detach().clone() for k, v in hf.state_dict().items()}
    del hf
    reload_s = []
    for _ in range(repeats):
        t = time.perf_counter()
        runner.engine.collective_rpc("reload_weights", kwargs={"weights_iterator": list(weights.items())})
        reload_s.append(time.perf_counter() - t)
    return {"rows": rows, "bare_reload_s": reload_s, "prompts": prompts,
            "params": {"n": s["generations_per_prompt"], "temperature": s["temperature"],
                       "max_new_tokens": env.max_new_tokens, "eos": sorted(env.eos_token_ids)}}


def hf_tokens_per_s(model_path: str, prompts: list, params: dict, repeats: int) -> list[float]:
    """Hugging Face ``generate`` doing a searcher's job: sample n responses per prompt with their log-probs."""
    import torch
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    pad = params["eos"][0]
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])  # left-padded
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    rates = []
    for _ in range(repeats):
        t = time.perf_counter()
        with torch.no_grad():
            out = lm.generate(input_ids=ids, attention_mask=mask, do_sample=True, top_k=0, top_p=1.0,
                              temperature=params["temperature"], max_new_tokens=params["max_new_tokens"],
                              num_return_sequences=params["n"], eos_token_id=params["eos"], pad_token_id=pad,
                              output_scores=True, return_dict_in_generate=True)
            lm.compute_transition_scores(out.sequences, out.scores, normalize_logits=True)
        seconds = time.perf_counter() - t
        new = out.sequences[:, width:]
        ended = torch.cumsum(torch.isin(new, torch.tensor(params["eos"])), 1)
        tokens = int(((ended == 0) | ((ended == 1) & torch.isin(new, torch.tensor(params["eos"])))).sum())
        rates.append(tokens / seconds)
    return rates


# ---- the learner ------------------------------------------------------------------------------------------------
def learner_timings(algo, batch: dict, repeats: int) -> dict:
    """TB Learner update vs the same computation in bare torch (same model, LoRA, batch, threads)."""
    import torch
    from ray.rllib.core import DEFAULT_MODULE_ID
    from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
    from transformers import AutoModelForCausalLM

    from rllib_tba.vllm_env_runner import WEIGHTS_VERSION

    c = algo.config
    module = algo.learner_group._learner.module[DEFAULT_MODULE_ID].unwrapped()
    policy = AutoModelForCausalLM.from_pretrained(module.model_path, dtype=torch.float32)
    if c.lora:
        from peft import LoraConfig, get_peft_model

        policy = get_peft_model(policy, LoraConfig(task_type="CAUSAL_LM", **c.lora))
    ref = AutoModelForCausalLM.from_pretrained(module.model_path, dtype=torch.float32).eval().requires_grad_(False)
    params = [p for p in policy.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=c.lr, weight_decay=0.0)
    t_ = {k: torch.as_tensor(v) for k, v in batch.items()}
    ids, attn, resp = t_["input_ids"], t_["attention_mask"], t_["response_mask"]
    reward, group = t_["reward"].double(), t_["group"]
    temp, beta = c.sampling_temperature, c.beta

    def seq_logp(lm):
        logits = lm(input_ids=ids, attention_mask=attn).logits[:, :-1].float() / temp
        lp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None])[..., 0]
        return (lp * resp[:, 1:]).sum(-1).double()

    def bare_step():
        with torch.no_grad():
            ref_lp = seq_logp(ref)
        lp = seq_logp(policy)
        implied = reward / beta + ref_lp - lp  # VarGrad: per-group mean of the implied logZ
        _, inverse = torch.unique(group, return_inverse=True)
        mean = torch.zeros(int(inverse.max()) + 1, dtype=implied.dtype).index_add(0, inverse, implied) / \
            torch.bincount(inverse).to(implied.dtype)
        loss = ((implied - mean[inverse]) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, c.grad_clip or float("inf"))
        opt.step()

    def learner_step(with_ref=False):
        data = dict(batch, ref_logp=batch["reward"].copy()) if with_ref else dict(batch)  # values: timing only
        algo.learner_group.update(batch=MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(data)},
                                                        env_steps=len(batch["reward"])),
                                  timesteps={WEIGHTS_VERSION: algo.weights_version})

    bare_step(), learner_step()  # warm-up
    bare, learner, learner_ref_given = [], [], []
    for _ in range(repeats):
        for fn, times in ((bare_step, bare), (learner_step, learner), (lambda: learner_step(True), learner_ref_given)):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
    return {"bare_update_s": bare, "learner_update_s": learner, "learner_update_ref_given_s": learner_ref_given}


# ---- asynchronous vs synchronous -----------------------------------------------------------------------------------
def timed_segments(algo, repeats: int, updates: int) -> dict:
    """Train until warm (first update done), then ``repeats`` segments of ``updates`` learner updates each."""
    while algo.weights_version == 0:
        algo.train()
    seconds, results = [], []
    for _ in range(repeats):
        start, v0 = time.perf_counter(), algo.weights_version
        while algo.weights_version < v0 + updates:
            results.append(algo.train())
        seconds.append((time.perf_counter() - start) / (algo.weights_version - v0))
    spans = {"updates": list(algo.timeline["updates"]), "samples": list(algo.timeline["samples"])}
    # the attack budget: samples generated per learner update over the whole run (a segment alone can live on
    # samples that arrived before it)
    per_update = algo.counters["samples_received"] / algo.weights_version
    return {"s_per_update": seconds, "samples_per_update": per_update, "results": results, "spans": spans}


def busy_seconds(spans, start: float = -math.inf) -> float:
    """Wall-clock seconds covered by the (start, end, ...) spans after ``start``; overlapping spans (searchers
    generating at the same time) count once."""
    total, reach = 0.0, start
    for s, e, *_ in sorted(spans):
        s, e = max(s, reach), max(e, reach)
        total, reach = total + e - s, e
    return total


def run_all(args) -> dict:
    import ray
    import torch

    from rllib_tba import TBA
    from rllib_tba.tba_learner import build_train_batch

    results: dict = {}
    log(f"replay buffer: {args.buffer_samples} samples in one prompt group")
    results.update(bench_buffer(args.buffer_samples, args.repeats))

    base = load_config(args)
    c = base
    per_update = c.updates_per_iteration * c.prompts_per_batch * c.num_samples_per_prompt
    per_call = c.prompts_per_generation * c.generations_per_prompt
    intensity = per_update / per_call  # async trains on what sync generates per update: the same attack budget
    ray.init(num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False)
    try:
        async_config = base.copy(copy_frozen=False).training(async_mode=True, training_intensity=intensity)
        log("asynchronous TBA: building (searcher actor + learner)")
        algo = async_config.build_algo()
        try:
            log("searcher vs bare vLLM, bytes per token, bare reload (inside the searcher)")
            inside = algo.env_runner_group.foreach_env_runner(
                lambda r: searcher_timings(r, args.repeats), local_env_runner=False)[0]
            rows = inside["rows"]
            results["searcher_vs_bare_vllm"] = median([r["runner_tokens_per_s"] / r["bare_tokens_per_s"] for r in rows])
            results["searcher_tokens_per_s"] = median([r["runner_tokens_per_s"] for r in rows])
            results["bytes_per_token"] = median([r["bytes_per_token"] for r in rows])
            results["episode_bytes_per_token"] = median([r["episode_bytes_per_token"] for r in rows])
            results["searcher_samples_per_s"] = median([r["samples_per_s"] for r in rows])
            results["tokens_per_sample"] = median([r["tokens_per_sample"] for r in rows])
            results["model_parameters"] = sum(p.numel() for p in algo.learner_group._learner.module[
                "default_policy"].unwrapped().lm.parameters())
            log("full weight sync vs bare reload")
            sync_s = []
            for _ in range(args.repeats):
                t = time.perf_counter()
                algo._push_weights(block=True, mark_sync=False)  # what restore/restart use: learner -> searchers
                sync_s.append(time.perf_counter() - t)
            results["sync_vs_bare_reload"] = median(sync_s) / median(inside["bare_reload_s"])
            results["sync_s"], results["bare_reload_s"] = median(sync_s), median(inside["bare_reload_s"])
            log("Hugging Face generate doing the searcher's job")
            threads = torch.get_num_threads()
            torch.set_num_threads(max(1, int(c.num_cpus_per_env_runner)))  # the searcher's share of the CPU
            hf = hf_tokens_per_s(algo.env_runner.env.model_path, inside["prompts"], inside["params"], args.repeats)
            torch.set_num_threads(threads)
            results["hf_tokens_per_s"] = median(hf)
            results["vllm_vs_hf_searcher"] = results["searcher_tokens_per_s"] / results["hf_tokens_per_s"]
            log("TB learner update vs bare torch")
            gen = algo.env_runner_group.foreach_env_runner(lambda r: r.generate().without_infos(),
                                                           local_env_runner=False)[0]
            samples = TBA.batch_to_samples(gen)
            algo.buffer.add(samples)
            drawn, groups, _ = algo.buffer.sample(c.prompts_per_batch, c.num_samples_per_prompt, 0.0, c.reward_inv_temp)
            lt = learner_timings(algo, build_train_batch(drawn, groups), args.repeats)
            results["learner_vs_bare_torch"] = median(lt["bare_update_s"]) / median(lt["learner_update_s"])
            results["learner_update_s"] = median(lt["learner_update_s"])
            # reference log-probs on the learner (a forward per update) vs on the searchers (once per sample)
            batch_size = c.prompts_per_batch * c.num_samples_per_prompt
            results["ref_logp_learner_s_per_sample"] = \
                (median(lt["learner_update_s"]) - median(lt["learner_update_ref_given_s"])) / batch_size
            results["ref_logp_searcher_s_per_sample"] = median([r["ref_logp_s_per_sample"] for r in rows])
            log(f"asynchronous training: {args.repeats} segments of {c.updates_per_iteration} updates")
            a = timed_segments(algo, args.repeats, c.updates_per_iteration)
        finally:
            algo.stop()
        log("synchronous TBA: building")
        sync_algo = base.copy(copy_frozen=False).training(async_mode=False, training_intensity=None).build_algo()
        try:
            log(f"synchronous training: {args.repeats} segments of {c.updates_per_iteration} updates")
            s = timed_segments(sync_algo, args.repeats, c.updates_per_iteration)
        finally:
            sync_algo.stop()
    finally:
        ray.shutdown()

    results["async_vs_sync_speedup"] = median(s["s_per_update"]) / median(a["s_per_update"])
    results["sync_s_per_update"], results["async_s_per_update"] = median(s["s_per_update"]), median(a["s_per_update"])
    results["samples_per_update_sync"] = s["samples_per_update"]
    results["samples_per_update_async"] = a["samples_per_update"]
    gen_s, train_s = busy_seconds(s["spans"]["samples"]), busy_seconds(s["spans"]["updates"])
    results["async_speedup_bound"] = (gen_s + train_s) / max(gen_s, train_s)  # perfect overlap of sync's two parts
    tba = [r["tba"] for r in a["results"]]
    results["learner_idle_fraction"] = median([t["learner_idle_fraction"] for t in tba])
    results["searcher_idle_fraction"] = median([t.get("searcher_idle_fraction", np.nan) for t in tba])
    results["learner_stall_during_sync_s"] = median([t.get("sync_stall_s", np.nan) for t in tba])
    results["learner_wait_fraction"] = float(sum(t["learner_wait_s"] for t in tba) /
                                             (len(tba) * median(a["s_per_update"]) * c.updates_per_iteration))
    results["staleness_mean"] = median([t["staleness_mean"] for t in tba])
    results["staleness_max"] = int(max(t["staleness_max"] for t in tba))
    results["timeline"] = {"async": a["spans"], "sync": s["spans"]}
    results["config"] = {"batch_size": c.prompts_per_batch * c.num_samples_per_prompt, "sync_every": c.sync_every,
                         "samples_per_update": per_call / c.updates_per_iteration,
                         "allreduce_bytes_per_s": args.allreduce_gb_per_s * 1e9}
    return results


def load_config(args):
    if args.quick:
        from tba_tiny import tiny_config

        return tiny_config(max_new_tokens=12, prompts_per_batch=4, num_samples_per_prompt=4, prompts_per_generation=4,
                           generations_per_prompt=4, min_buffer_size=16, sync_every=2, updates_per_iteration=2)
    spec = importlib.util.spec_from_file_location("tuned", ROOT / "tuned_examples" / "tba_redteam.py")
    tuned = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tuned)
    # one searcher with one CPU and the learner on the other, in "auto" precision: each side's share of the machine
    # stays one core, so the ratios below compare the same parts whatever the example's layout and the CPU's bf16
    return tuned.config.copy(copy_frozen=False).env_runners(num_env_runners=1, num_cpus_per_env_runner=1).training(
        learner_precision="auto")


# ---- reporting ---------------------------------------------------------------------------------------------------
def cpu_name(cpuinfo: str) -> str:
    """The first CPU's model name from /proc/cpuinfo text. Virtual machines often report a bare family name ("Intel(R)
    Xeon(R) Processor", "AMD EPYC") that hides which generation runs the code; such a name gets the CPU's family and
    model numbers, so runs on two different hosts of one vendor are not taken for runs on one machine."""
    fields = {}
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            if fields:  # the end of the first CPU's block
                break
            continue
        fields.setdefault(key.strip(), value.strip())
    name = fields.get("model name", "")
    if name and not any(ch.isdigit() for ch in name) and "cpu family" in fields and "model" in fields:
        name += f" (family {fields['cpu family']}, model {fields['model']})"
    return name


def machine() -> dict:
    import torch
    import vllm

    try:
        cpu = cpu_name(Path("/proc/cpuinfo").read_text()) or platform.processor()
    except OSError:
        cpu = platform.processor()
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
            "vllm": vllm.__version__, "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


def machine_line() -> str:
    """The machine in one line (what the red-team and math JSONs and README blocks name)."""
    m = machine()
    return f"{m['cpu']}, {m['cores']} CPUs, {m['gpu'] or 'no GPU'}"


def commit() -> str:
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.strip()
        # what this script, the red-team frontier and math_seeds themselves rewrite does not make a run "dirty"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":!README.md",
                                ":!benchmarks/results.*", ":!benchmarks/redteam_*", ":!benchmarks/math_seeds.json"],
                               cwd=ROOT, capture_output=True, text=True).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def met(key: str, value: float) -> str:
    if key not in GOALS or value is None or not np.isfinite(value):
        return ""
    op, goal = GOALS[key]
    ok = value >= goal if op == ">=" else value <= goal
    return f"{op} {goal:g}: {'met' if ok else 'MISSED'}"


def table(results: dict) -> str:
    rows = [("async_vs_sync_speedup", "async ÷ sync time per learner update (bound: {async_speedup_bound:.2f})"),
            ("searcher_vs_bare_vllm", "searcher ÷ bare vLLM tokens/s"),
            ("vllm_vs_hf_searcher", "vLLM searcher ÷ HF generate tokens/s"),
            ("learner_vs_bare_torch", "bare torch ÷ TB learner seconds per update"),
            ("sync_vs_bare_reload", "full weight sync ÷ bare reload_weights"),
            ("learner_stall_during_sync_s", "seconds an async weight push holds the learner"),
            ("learner_idle_fraction", "learner idle (async, buffer warm)"),
            ("searcher_idle_fraction", "searcher idle (async)"),
            ("buffer_sample_ms_1m", "prioritised draw, {buffer_samples} samples in one prompt, ms"),
            ("buffer_sample_ms_1m_uniform", "uniform draw, same buffer, ms"),
            ("bytes_per_token", "bytes on the wire per generated token (episodes: {episode_bytes_per_token:.0f})"),
            ("ref_logp_learner_s_per_sample", "reference log-probs on the learner, s per sample trained"),
            ("ref_logp_searcher_s_per_sample", "reference log-probs on a searcher (vLLM), s per sample generated")]
    lines = ["| key | what | value | goal |", "|---|---|---|---|"]
    for key, what in rows:
        value = results.get(key)
        shown = "n/a" if value is None else f"{value:.3g}"
        lines.append(f"| `{key}` | {what.format(**results)} | {shown} | {met(key, value)} |")
    return "\n".join(lines)


def scaling_model(results: dict, config_summary: dict) -> str:
    """docs/scaling.md's model with this run's measured costs: learner updates/s of N searchers x M learners."""
    g = results["searcher_samples_per_s"]  # one searcher, generation + scoring
    u = results["learner_update_s"]  # one learner, one batch
    need = config_summary["samples_per_update"]  # samples generated per learner update (1 / reuse)
    sync = results["sync_s"] / config_summary["sync_every"]  # a searcher's weight-load time per learner update
    params_bytes = 4 * results["model_parameters"]
    lines = ["| searchers N | learners M | learner-bound updates/s | searcher-bound updates/s | saturates first |",
             "|---|---|---|---|---|"]
    for m in (1, 2, 4):
        allreduce = 0.0 if m == 1 else 2 * params_bytes * (m - 1) / m / config_summary["allreduce_bytes_per_s"]
        learner_rate = 1.0 / (u / m + allreduce)
        for n in (1, 2, 4, 8):
            searcher_rate = 1.0 / (need / (n * g) + sync)  # each searcher also loads the weights of every sync
            first = "learners" if learner_rate < searcher_rate else "searchers"
            lines.append(f"| {n} | {m} | {learner_rate:.3f} | {searcher_rate:.3f} | {first} |")
    return "\n".join(lines)


def write_outputs(results: dict, out: Path, quick: bool) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    timeline = results.pop("timeline")
    (out / "results.json").write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    m = results["machine"]
    md = [f"# Benchmark results ({'quick: tiny model' if quick else 'SmolLM2 red-team tuned example'})", "",
          f"Commit `{results['commit']}`, {m['cpu']} ({m['cores']} cores), torch {m['torch']}, vLLM {m['vllm']}; "
          f"median of {results['repeats']} side-by-side repeats. Re-run: `scripts/bench.sh{' --quick' if quick else ''}`.",
          "", table(results), "",
          f"Sync vs async: {results['sync_s_per_update']:.2f} s vs {results['async_s_per_update']:.2f} s per update, "
          f"{results['samples_per_update_sync']:.1f} vs {results['samples_per_update_async']:.1f} samples generated "
          f"per update; in sync mode generation and training took the shares that bound a perfect overlap at "
          f"{results['async_speedup_bound']:.2f}x. Async staleness mean {results['staleness_mean']:.1f}, max "
          f"{results['staleness_max']}; the learner waited for samples {100 * results['learner_wait_fraction']:.0f}% "
          f"of the time.", "",
          "## Scaling model (docs/scaling.md) with these costs", "",
          f"One searcher: {results['searcher_samples_per_s']:.2f} samples/s with scoring "
          f"({results['tokens_per_sample']:.0f} tokens each); one learner: {results['learner_update_s']:.2f} s per "
          f"update of {results['config']['batch_size']} samples; a weight load: {results['sync_s']:.2f} s every "
          f"{results['config']['sync_every']} updates; {results['config']['samples_per_update']:.1f} samples "
          f"generated per update; DDP all-reduce assumed at {results['config']['allreduce_bytes_per_s'] / 1e9:g} GB/s "
          f"for {results['model_parameters'] / 1e6:.0f}M fp32 parameters.", "",
          scaling_model(results, results["config"]), ""]
    (out / "results.md").write_text("\n".join(md))

    keys = [k for k in ("async_vs_sync_speedup", "searcher_vs_bare_vllm", "learner_vs_bare_torch",
                        "sync_vs_bare_reload") if results.get(k) is not None]
    fig, ax = plt.subplots(figsize=(7, 3.2))
    ax.barh(keys, [results[k] for k in keys], color="tab:blue")
    ax.scatter([GOALS[k][1] for k in keys], keys, color="tab:red", marker="|", s=400, label="goal", zorder=3)
    ax.set_xlabel("ratio (side by side, median)")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(out / "ratios.png", dpi=120)
    plt.close(fig)

    fig, axes = plt.subplots(2, 1, figsize=(9, 3.6), sharex=False)
    for ax, mode in zip(axes, ("sync", "async")):
        spans = timeline[mode]
        t0 = min([s[0] for s in spans["updates"] + spans["samples"]] or [0])
        for row, (name, color) in enumerate((("samples", "tab:orange"), ("updates", "tab:blue"))):
            ax.broken_barh([(s[0] - t0, s[1] - s[0]) for s in spans[name]], (row, 0.8), color=color,
                           edgecolor="white", linewidth=0.6)  # back-to-back calls stay apart
        ax.set_yticks([0.4, 1.4], ["searcher", "learner"])
        ax.set_title(f"{mode}: searcher generation calls and learner updates", fontsize=9)
    axes[-1].set_xlabel("seconds")
    fig.tight_layout()
    fig.savefig(out / "timeline.png", dpi=120)
    plt.close(fig)


def update_readme(results: dict) -> None:
    m = results["machine"]
    replace_readme_block("bench-table", f"{table(results)}\n\nMeasured by `scripts/bench.sh` at commit "
                                        f"`{results['commit']}` on {m['cpu']} ({m['cores']} cores); full results in "
                                        "benchmarks/results.md.")


def replace_readme_block(name: str, body: str) -> None:
    """Replace what README.md holds between ``<!-- name:start -->`` and ``<!-- name:end -->`` (if it has them)."""
    readme = ROOT / "README.md"
    text = readme.read_text()
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    if start in text and end in text:
        text = text[:text.index(start)] + f"{start}\n{body}\n{end}" + text[text.index(end) + len(end):]
        readme.write_text(text)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny model, 100k-sample buffer (< 3 min)")
    ap.add_argument("--out", type=Path, default=None, help="output folder (default benchmarks/)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--buffer-samples", type=int, default=None)
    ap.add_argument("--num-cpus", type=int, default=2)
    ap.add_argument("--allreduce-gb-per-s", type=float, default=1.0,
                    help="DDP all-reduce bandwidth the scaling model assumes (gloo on CPU ~1; NVLink ~100)")
    args = ap.parse_args(argv)
    if args.repeats < 3:
        ap.error("--repeats must be >= 3 (every figure is a median of side-by-side repeats)")
    args.buffer_samples = args.buffer_samples or (100_000 if args.quick else 1_000_000)
    out = args.out or ROOT / "benchmarks"
    t0 = time.time()
    results = run_all(args)
    results.update(machine=machine(), commit=commit(), repeats=args.repeats, quick=args.quick,
                   wall_s=round(time.time() - t0, 1))
    write_outputs(results, out, args.quick)
    if not args.quick and args.out is None:
        update_readme(results)
    print((out / "results.md").read_text())
    return results


if __name__ == "__main__":
    from rllib_tba.console import quiet_libraries

    quiet_libraries()
    main()
