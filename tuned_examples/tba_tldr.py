"""TBA preference tuning (TL;DR summarisation) with a reward model.

    rllib train file tuned_examples/tba_tldr.py

Runs offline on the bundled STAND-IN data (envs/data/tldr_standin.jsonl) and the stand-in reward (unigram F1
against the reference summary; -1 without EOS). For the real task give your data and reward model:
env_config dataset="tldr_train.jsonl" ({"post": ..., "summary": ...} rows), reward_model="<HF RM id or path>";
on a GPU policy_model="<Pythia-410M SFT id or path>". Paper (TBA_METHOD.md §5): lr 3e-6, K=20, 8 prompts, m=0.5,
k=10, beta 1.0 -> 0.05, min buffer 10k.
"""

from rllib_tba import TBAConfig

config = (
    TBAConfig()
    .environment("tba/TLDR-v0", env_config={"reward_model": "standin-rouge1", "no_eos_reward": -1.0})
    .training(
        policy_model="smollm2-135m-instruct", max_new_tokens=32, sampling_temperature=1.0,
        m=0.5, sync_every=10, beta_schedule=[[0, 1.0], [300, 0.05]],
        prompts_per_batch=4, num_samples_per_prompt=8, samples_per_prompt=8, prompts_per_sample=4,
        min_buffer_size=64, lr=3e-6, grad_clip=1.0, updates_per_iteration=5,
    )
    .env_runners(num_env_runners=1, num_cpus_per_env_runner=1)
    .debugging(seed=0)
)

stop = {"time_total_s": 10 * 60}
