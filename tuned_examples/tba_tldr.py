"""TBA preference tuning (TL;DR summarisation) with a reward model.

    rllib train file tuned_examples/tba_tldr.py

Runs offline on the bundled STAND-IN data (envs/data/tldr_standin.jsonl) and the stand-in reward (unigram F1
against the reference summary; -1 without EOS). For the real task give your data and reward model:
env_config dataset="tldr_train.jsonl" ({"post": ..., "summary": ...} rows), reward_model="<HF RM id or path>";
on a GPU policy_model="<Pythia-410M SFT id or path>", the default template ("{post}\nTL;DR:"), no LoRA. Paper
(docs/method.md §4): lr 3e-6 (full fine-tuning), K=20, 8 prompts, m=0.5, k=10, beta 1.0 -> 0.05, min buffer 10k.
"""

from rllib_tba import TBAConfig

config = (
    TBAConfig()
    .environment("tba/TLDR-v0", env_config={
        "reward_model": "standin-rouge1", "no_eos_reward": -1.0,
        # an instruct model asked for "TL;DR:" rambles past 64 tokens (EOS in 6% of 96 samples here); asked for one
        # sentence it stops within 48 tokens in 72% of them
        "template": "Summarize this post in one short sentence.\n\n{post}",
    })
    .training(
        policy_model="smollm2-135m-instruct", max_new_tokens=48, sampling_temperature=1.0,
        m=0.5, sync_every=10, beta_schedule=[[0, 1.0], [30, 0.05]],  # the paper's 1.0 -> 0.05, over a CPU budget
        prompts_per_batch=4, num_samples_per_prompt=8, generations_per_prompt=8, prompts_per_generation=4,
        min_buffer_size=64, lr=1e-4, grad_clip=1.0, updates_per_iteration=5,
        lora={"r": 16, "lora_alpha": 32, "target_modules": "all-linear"}, learner_precision="auto",
    )
    .env_runners(num_env_runners=1, num_cpus_per_env_runner=1)
    .debugging(seed=0)
)

# A training budget, not wall-clock (20 learner updates took ~10 min here).
stop = {"tba/weights_version": 20}
