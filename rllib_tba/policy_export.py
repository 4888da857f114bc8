"""From a TBA (or PPO-with-HFCausalLMRLModule) checkpoint to things users run: an HF model dir, task metrics.

- :func:`load_checkpoint_config` reads the AlgorithmConfig stored in an RLlib checkpoint (no actors started);
  :func:`with_env_overrides` changes its task settings.
- :func:`export_hf_model` writes the trained policy as a plain Hugging Face directory (LoRA merged) that
  transformers and vLLM load.
(Task metrics of an exported model: :func:`envs.evaluation.evaluate_policy`.)
"""

from __future__ import annotations

import json
from pathlib import Path

from rllib_tba.checkpoint_files import load_pickle

MODULE_SUBDIR = Path("learner_group") / "learner" / "rl_module" / "default_policy"


def load_checkpoint_config(checkpoint: str | Path):
    """The AlgorithmConfig an RLlib algorithm checkpoint was created with."""
    path = Path(checkpoint)
    ctor = path / "class_and_ctor_args.pkl"
    if not ctor.is_file():
        raise FileNotFoundError(f"{path} is not an RLlib algorithm checkpoint (no class_and_ctor_args.pkl)")
    data = load_pickle(ctor)
    args, kwargs = data["ctor_args_and_kwargs"]
    config = kwargs.get("config", args[0] if args else None)
    if isinstance(config, dict):  # checkpoints written under Tune store the config as a dict
        config = data["class"].get_default_config().update_from_dict(config)
    return config


def with_env_overrides(config, overrides: dict):
    """``config`` with ``overrides`` merged into its env_config (e.g. held-out data seeds). Keys that an algorithm
    setting would replace (TBAConfig.ENV_CONFIG_FIELDS, e.g. ``max_new_tokens``) set that setting instead."""
    if overrides:
        config.env_config = {**dict(config.env_config or {}), **overrides}
        for key, attr in getattr(config, "ENV_CONFIG_FIELDS", {}).items():
            if key in overrides:
                setattr(config, attr, overrides[key])
    return config


def load_policy_module(checkpoint: str | Path):
    from ray.rllib.core.rl_module.rl_module import RLModule

    path = Path(checkpoint).resolve() / MODULE_SUBDIR  # RLlib wants an absolute path (or URI)
    if not path.is_dir():
        raise FileNotFoundError(f"{checkpoint}: no policy module at {MODULE_SUBDIR}")
    return RLModule.from_checkpoint(str(path))


def export_hf_model(checkpoint: str | Path, out_dir: str | Path) -> str:
    """Write the checkpoint's policy LM (+ its tokenizer) as a Hugging Face model directory; returns its path."""
    import torch
    from transformers import AutoTokenizer

    from rllib_tba.hf_rl_module import merged_lora_state

    module = load_policy_module(checkpoint)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    lm = module.lm
    if getattr(module, "lora", None):
        from transformers import AutoModelForCausalLM

        plain = AutoModelForCausalLM.from_pretrained(module.model_path, dtype=torch.float32)
        plain.load_state_dict(merged_lora_state(lm))
        lm = plain
    lm.save_pretrained(out, safe_serialization=True)
    AutoTokenizer.from_pretrained(module.model_path).save_pretrained(out)
    (out / "rllib_tba_export.json").write_text(json.dumps({"checkpoint": str(Path(checkpoint).resolve()),
                                                          "base_model": module.model_path,
                                                          "temperature": module.temperature}, indent=2))
    return str(out)
