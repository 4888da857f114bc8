"""TBA on math word problems (reasoning-gym generators) with SmolLM2-135M-Instruct; reward 1 for the right final number.

    rllib train file tuned_examples/tba_math.py
    rllib evaluate results/tba_math/<trial>/checkpoint_000000 --greedy --num-samples 200   # pass@1

GSM8K setup of the paper (docs/method.md §4): lr 1e-5, K=20, 7 prompts/batch, m=0.95, k=2, beta 0.012 -> 0.004
over 500 steps, min buffer 500; scaled down here. With a GSM8K jsonl: env_config dataset="path/gsm8k_train.jsonl".
On a GPU: policy_model="realtreetune/rho-1b-sft-GSM8K" (the paper's start) and larger K / batch.
"""

from rllib_tba import TBAConfig

config = (
    TBAConfig()
    .environment("tba/Math-v0", env_config={
        "dataset": "basic_arithmetic",
        "dataset_kwargs": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2,
                           "operators": ["+", "-"], "allow_parentheses": False, "allow_negation": False},
        "size": 2000,
        "dataset_seed": 0,            # training problems; evaluate on another seed (held out)
    })
    .training(
        policy_model="smollm2-135m-instruct", max_new_tokens=32, sampling_temperature=1.0,
        m=0.95, sync_every=2, beta_schedule=[[0, 0.012], [500, 0.004]],
        prompts_per_batch=2, num_samples_per_prompt=8, generations_per_prompt=8, prompts_per_generation=8,
        min_buffer_size=64, lr=1e-4, grad_clip=1.0, updates_per_iteration=5,
        # CPU budget (see tba_redteam.py): LoRA on every linear layer + bf16 autocast where the CPU has native bf16
        lora={"r": 16, "lora_alpha": 32, "target_modules": "all-linear"}, learner_precision="auto",
        share_prompt_forward=False,  # as validated on 3 seeds (docs/performance.md)
    )
    .env_runners(num_env_runners=1, num_cpus_per_env_runner=1)
    .debugging(seed=0)
)

# A training budget, not wall-clock (95 learner updates took 15-16 min here; 3 seeds: tuned_examples/math_seeds.py).
stop = {"tba/weights_version": 95}
