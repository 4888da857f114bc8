"""MLE smoothing (Lee et al. 2024, "Learning diverse attacks on large language models for robust red-teaming", stage 2):
a policy fitted by maximum likelihood to the high-reward samples a TBA run's replay buffer collected.

A trajectory-balance run stores every sample its searchers generated; the ones with high reward span everything the
search found over the whole run, while the final policy may have concentrated on the last mode it found. Smoothing
restarts from the reference policy and fits it to those samples, each distinct one once:

    D      = { (x, y) in the buffer : r(x, y) >= min_reward }           (exact repeats of (x, y) counted once)
    theta* = argmin_theta  - sum_{(x, y) in D} sum_t log pi_theta(y_t | x, y_<t)        (``epochs`` passes of Adam)

with pi_theta's logits divided by the module's sampling temperature, as the searchers sample. The result is a copy of
the checkpoint whose policy is the smoothed one, so ``rllib evaluate / serve / export`` take it like any checkpoint.
``--pool`` adds the buffers of more TBA runs of the same task, policy model, prompt set and env settings (other
training seeds, say): D is then taken over all the buffers together, each distinct (x, y) once; the runs must agree on
what a reward means, so any difference in their env_config is refused.

    rllib smooth CHECKPOINT OUT_DIR --min-reward R [--pool CKPT ...] [--epochs 10] [--lr 1e-3] [--batch-size 16]
                 [--seed 0]
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from rllib_tba.checkpoint_files import CheckpointError, read_checkpoint_state
from rllib_tba.policy_export import MODULE_SUBDIR, load_policy_module

RECORD = "mle_smoothing.json"  # what a smoothed checkpoint says about how it was made


def high_reward_samples(buffer_state: dict, min_reward: float, seen: set | None = None) -> list[tuple[tuple, tuple]]:
    """(prompt ids, completion ids) of every stored sample with reward >= ``min_reward``, in arrival order; a sample
    whose prompt and completion repeat an earlier one's (or one in ``seen``, which it adds to) is taken once (the fit
    weighs what was found, not how often the searchers drew it)."""
    seen, out = set() if seen is None else seen, []
    for row in buffer_state["samples"]:  # TBAReplayBuffer.get_state() rows: (prompt_key, prompt_ids, completion, reward, ...)
        if row[3] >= min_reward:
            sample = (tuple(int(t) for t in row[1]), tuple(int(t) for t in row[2]))
            if sample not in seen:
                seen.add(sample)
                out.append(sample)
    return out


def reset_to_reference(module) -> None:
    """Make ``module``'s LM the reference policy again: LoRA adapters re-initialised (B = 0, so they add nothing), or
    for a full fine-tune the reference weights reloaded."""
    if getattr(module, "lora", None):
        for layer in module.lm.modules():
            if hasattr(layer, "reset_lora_parameters") and hasattr(layer, "lora_A"):
                for adapter in list(layer.lora_A.keys()):
                    layer.reset_lora_parameters(adapter, True)
    else:
        import torch
        from transformers import AutoModelForCausalLM

        module.lm.load_state_dict(AutoModelForCausalLM.from_pretrained(module.model_path, dtype=torch.float32).state_dict())


def completion_nll(lm, samples: list[tuple[tuple, tuple]], temperature: float):
    """Mean negative log-likelihood per completion token of ``samples`` under ``lm`` (logits / temperature), through
    the learner's own batch layout and log-prob pass (``build_train_batch``, ``response_logprobs``)."""
    import torch

    from rllib_tba.tba_learner import build_train_batch
    from rllib_tba.tba_replay_buffer import TBSample
    from rllib_tba.tba_rl_module import response_logprobs

    batch = build_train_batch([TBSample(0, x, np.asarray(y), 0.0, 0) for x, y in samples], np.zeros(len(samples)))
    response = torch.as_tensor(batch["response_mask"])
    logp = response_logprobs(lm, torch.as_tensor(batch["input_ids"]), torch.as_tensor(batch["attention_mask"]),
                             response, temperature)
    return -logp.sum() / response.sum()


def fit(module, samples: list[tuple[tuple, tuple]], epochs: int, lr: float, batch_size: int, seed: int) -> list[float]:
    """``epochs`` passes of Adam over ``samples`` (shuffled by ``seed``, gradients clipped at 1.0) on the module's
    trainable parameters, from the reference policy; returns each pass's mean loss."""
    import torch

    torch.manual_seed(seed)
    reset_to_reference(module)
    params = [p for p in module.lm.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(params, lr=lr)
    rng = np.random.default_rng(seed)
    temperature = float(getattr(module, "temperature", 1.0))
    module.lm.train()
    losses = []
    steps = -(-len(samples) // batch_size)
    with tqdm(total=epochs * steps, desc=f"MLE smoothing on {len(samples)} samples", unit="batch") as bar:
        for _ in range(epochs):
            order, total = rng.permutation(len(samples)), []
            for start in range(0, len(order), batch_size):
                loss = completion_nll(module.lm, [samples[i] for i in order[start:start + batch_size]], temperature)
                optimizer.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                optimizer.step()
                total.append(loss.item())
                bar.update()
            losses.append(float(np.mean(total)))
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
    module.lm.eval()
    return losses


def stored_buffer(checkpoint: Path) -> dict:
    """The TBA replay buffer state (plus the task it was collected on, under "task") of ``checkpoint``."""
    state = read_checkpoint_state(checkpoint)
    if "buffer" not in state.get("tba", {}):
        raise CheckpointError(f"{checkpoint} holds no TBA replay buffer (smoothing needs the samples a TBA run stored)")
    return {**state["tba"]["buffer"], "task": state["tba"].get("task")}


def env_settings(checkpoint: Path) -> dict:
    """The env_config a checkpoint's run trained with."""
    from rllib_tba.policy_export import load_checkpoint_config

    return dict(load_checkpoint_config(checkpoint).env_config or {})


def check_poolable(checkpoint: Path, task: dict | None, mine: dict, other: Path, other_task: dict | None) -> None:
    """Raise ``ValueError`` unless ``other``'s samples mean what ``checkpoint``'s mean (its task ``task``, env
    settings ``mine``): the same task, policy model (token ids), prompt set and env settings (the reward)."""
    from rllib_tba.tba import check_same_task

    try:
        check_same_task(other_task, task)
    except ValueError as e:
        raise ValueError(f"--pool {other}: {e}") from None
    theirs = env_settings(other)
    differ = sorted(k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k))
    if differ:
        raise ValueError(f"--pool {other}: its env settings differ from {checkpoint}'s in "
                         + ", ".join(f"{k} ({theirs.get(k)!r} vs {mine.get(k)!r})" for k in differ)
                         + ": its rewards do not mean the same, so its samples cannot join the fit")


def smooth_checkpoint(checkpoint: str | Path, out_dir: str | Path, min_reward: float, epochs: int = 10,
                      lr: float = 1e-3, batch_size: int = 16, seed: int = 0, pool=()) -> dict:
    """Write ``out_dir``: a copy of TBA checkpoint ``checkpoint`` whose policy is fitted to the samples with reward
    >= ``min_reward`` of its buffer and of the buffers of the ``pool`` checkpoints (see the module doc). Returns what
    it also writes to ``out_dir/mle_smoothing.json``."""
    checkpoint, out, pool = Path(checkpoint), Path(out_dir), [Path(c) for c in pool]
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} exists and is not empty: give a new directory (a smoothed checkpoint never "
                              "overwrites anything)")
    sources = [checkpoint, *pool]
    if len({c.resolve() for c in sources}) < len(sources):
        raise ValueError(f"--pool: a checkpoint is given twice ({', '.join(map(str, sources))})")
    buffers = [stored_buffer(c) for c in sources]
    mine = env_settings(checkpoint) if pool else {}
    for other, buffer in zip(pool, buffers[1:]):
        check_poolable(checkpoint, buffers[0]["task"], mine, other, buffer["task"])
    seen, samples, per_source = set(), [], []
    for buffer in buffers:
        found = high_reward_samples(buffer, min_reward, seen)
        samples += found
        per_source.append(len(found))
    if not samples:
        rewards = [row[3] for buffer in buffers for row in buffer["samples"]]
        best = f"the best is {max(rewards):.4g}" if rewards else "they are empty"
        raise ValueError(f"no sample in the buffer(s) of {', '.join(map(str, sources))} has reward >= {min_reward:g} "
                         f"({len(rewards)} stored, {best}): lower --min-reward")
    started = time.time()
    module = load_policy_module(checkpoint)
    losses = fit(module, samples, epochs, lr, batch_size, seed)
    # written next to out and renamed when complete: an interrupted smoothing leaves no half checkpoint at out (and
    # its leftover is replaced by the next attempt). Evaluations made of the source (eval_*.json) describe its
    # policy, not this one: not copied.
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(checkpoint, partial, ignore=shutil.ignore_patterns("eval_*.json"))
    module.save_to_path(str((partial / MODULE_SUBDIR).resolve()))
    record = {"source_checkpoint": str(checkpoint.resolve()), "min_reward": min_reward, "samples": len(samples),
              "stored": sum(len(b["samples"]) for b in buffers), "epochs": epochs, "lr": lr, "batch_size": batch_size,
              "seed": seed,
              "loss_per_epoch": [round(x, 4) for x in losses], "seconds": round(time.time() - started, 1)}
    if pool:  # new samples each source added, in order (a sample found by an earlier source counts there)
        record.update(pooled_checkpoints=[str(c.resolve()) for c in pool], samples_per_checkpoint=per_source)
    (partial / RECORD).write_text(json.dumps(record, indent=2))
    if out.exists():
        out.rmdir()  # the empty directory the caller may have made
    partial.rename(out)
    return record
