"""TBA on GSM8K with the paper's setting, for one node with 8 GPUs (4 searchers + 4 DDP learners) or a Ray cluster.

    ray start --head                      # or an existing cluster: export RAY_ADDRESS=<head-ip>:6379
    rllib train file tuned_examples/tba_gsm8k_gpu.py
    rllib evaluate results/tba_gsm8k_gpu/<trial>/checkpoint_000000 --greedy --num-samples 1319   # pass@1

The paper's GSM8K run (docs/method.md §4): Rho-1B-SFT start, lr 1e-5, K=20 samples per prompt, 7 prompts per
batch... here 8 prompts per batch so that the batch splits into whole prompt groups over 4 learners (2 each),
m=0.95 (uniform off-policy draws), k=2, beta 0.012 → 0.004 over 500 updates, a 500-sample initial fill.
Environment variables (not code) choose the scale:

    TBA_SEARCHERS   searchers, one GPU each (vLLM)            default 4
    TBA_LEARNERS    DDP learners, one GPU each (NCCL)          default 4
    TBA_GSM8K       the GSM8K train jsonl ({"question", "answer": "... #### 42"} rows); default: reasoning-gym's
                    gsm_symbolic generator (offline)
    TBA_POLICY      the policy / reference model id or path    default realtreetune/rho-1b-sft-GSM8K

N nodes × 8 GPUs: TBA_SEARCHERS + TBA_LEARNERS = 8·N, with TBA_LEARNERS dividing 8 (prompts per batch). Ray places
searchers and learners on any node with a free GPU; docs/scaling.md says how to choose the split.
"""

import os

from rllib_tba import TBAConfig

searchers = int(os.environ.get("TBA_SEARCHERS", 4))
learners = int(os.environ.get("TBA_LEARNERS", 4))
dataset = os.environ.get("TBA_GSM8K", "gsm_symbolic")

config = (
    TBAConfig()
    .environment("tba/Math-v0", env_config={
        "dataset": dataset, "size": 7473, "dataset_seed": 0, "max_prompt_tokens": 512,
    })
    .training(
        policy_model=os.environ.get("TBA_POLICY", "realtreetune/rho-1b-sft-GSM8K"),
        max_new_tokens=512, sampling_temperature=1.0,
        m=0.95, sync_every=2, beta_schedule=[[0, 0.012], [500, 0.004]], reward_inv_temp=0.0,
        prompts_per_batch=8, num_samples_per_prompt=20, generations_per_prompt=20, prompts_per_generation=8,
        min_buffer_size=500, buffer_capacity=100_000, per_prompt_capacity=100,
        lr=1e-5, grad_clip=1.0, updates_per_iteration=10,
        searcher_dtype="bfloat16", learner_precision="bf16-mixed",
    )
    .env_runners(num_env_runners=searchers, num_cpus_per_env_runner=4, num_gpus_per_env_runner=1)
    .learners(num_learners=learners, num_cpus_per_learner=4, num_gpus_per_learner=1)
    .debugging(seed=0)
)

progress_columns = {
    "tba/weights_version": "updates", "env_runners/num_episodes_lifetime": "samples",
    "task/correct": "correct", "tba/staleness_mean": "staleness", "tba/learner_idle_fraction": "learner idle",
}
# The paper trains 1000 updates; a budget in learner updates, never wall-clock.
stop = {"tba/weights_version": 1000}
