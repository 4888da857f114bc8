"""The ``rllib`` command (Ray >= 2.41 no longer ships one): train, evaluate, serve, export.

    rllib train file tuned_examples/tba_redteam.py [--stop '{"training_iteration": 10}'] [--checkpoint-freq 5]
    rllib evaluate CHECKPOINT [--num-samples 256] [--greedy]
    rllib serve CHECKPOINT [--host 127.0.0.1] [--port 8000]
    rllib export CHECKPOINT OUT_DIR

``train file`` runs a Python file that defines a module-level ``config`` (an AlgorithmConfig) and optionally
``stop`` (Tune stop criteria). The file's ``stop`` holds unless ``--stop`` is given. Training runs under Ray Tune:
progress table, TensorBoard event files and checkpoints in ``--storage-path`` (default ``./results``).
"""

from __future__ import annotations

import argparse
import json
import runpy
import sys
from pathlib import Path


def _json_arg(text: str):
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON ({e.msg}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object like '{{\"training_iteration\": 10}}', got {text!r}")
    return value


def load_experiment_file(path: str):
    """``(config, stop)`` from a tuned-example file."""
    file = Path(path)
    if not file.is_file():
        raise SystemExit(f"rllib train file: {path} does not exist")
    namespace = runpy.run_path(str(file), run_name="__rllib_train__")
    from ray.rllib.algorithms.algorithm_config import AlgorithmConfig

    config = namespace.get("config")
    if not isinstance(config, AlgorithmConfig):
        raise SystemExit(f"rllib train file: {path} must define a module-level `config` (an AlgorithmConfig), "
                         f"got {type(config).__name__}")
    stop = namespace.get("stop", {})
    if not isinstance(stop, dict):
        raise SystemExit(f"rllib train file: `stop` in {path} must be a dict, got {type(stop).__name__}")
    return config, stop


def cmd_train(args) -> int:
    import ray
    from ray import tune

    config, stop = load_experiment_file(args.path)
    if args.stop is not None:  # the command line wins; otherwise the file's `stop` holds
        stop = args.stop
    if args.num_env_runners is not None:
        config.env_runners(num_env_runners=args.num_env_runners)
    if args.restore:
        checkpoint = str(Path(args.restore).resolve())
        config.callbacks(on_algorithm_init=lambda algorithm, **_: algorithm.restore_from_path(checkpoint))
    storage = str(Path(args.storage_path).resolve())
    name = args.name or Path(args.path).stem
    if not ray.is_initialized():
        ray.init(num_cpus=args.num_cpus, include_dashboard=False)
    run_config = tune.RunConfig(
        name=name, storage_path=storage, stop=stop, verbose=args.verbose,
        checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=args.checkpoint_freq,
                                                checkpoint_at_end=args.checkpoint_at_end),
    )
    experiment = Path(storage) / name
    if args.resume and tune.Tuner.can_restore(str(experiment)):
        tuner = tune.Tuner.restore(str(experiment), trainable=config.algo_class, resume_unfinished=True, resume_errored=True)
    else:
        tuner = tune.Tuner(config.algo_class, param_space=config, run_config=run_config)
    results = tuner.fit()
    best = results.get_best_result() if len(results) else None
    if best is None or best.error:
        print(f"training failed: {best.error if best else 'no trial ran'}", file=sys.stderr)
        return 1
    print(json.dumps({"trial_dir": best.path, "checkpoint": best.checkpoint.path if best.checkpoint else None,
                      "training_iteration": best.metrics.get("training_iteration")}, indent=2))
    return 0


def cmd_evaluate(args) -> int:
    import tempfile

    from envs.evaluation import evaluate_policy
    from rllib_tba.policy_export import export_hf_model, load_checkpoint_config, with_env_overrides
    from rllib_tba.vllm_env_runner import make_task_env

    config = with_env_overrides(load_checkpoint_config(args.checkpoint), args.env_config or {})
    env = make_task_env(config)
    with tempfile.TemporaryDirectory(prefix="rllib-tba-eval-") as tmp:
        # --base-model: the same task and settings, but the policy the run started from (before/after comparisons)
        model_dir = env.model_path if args.base_model else export_hf_model(args.checkpoint, tmp)
        temperature = args.temperature if args.temperature is not None else getattr(config, "sampling_temperature", 1.0)
        metrics = evaluate_policy(env, model_dir, args.num_samples, temperature=temperature, greedy=args.greedy,
                                  seed=args.seed)
    metrics["checkpoint"] = str(args.checkpoint)
    metrics["model"] = "base (untrained)" if args.base_model else "trained"
    print(json.dumps(metrics, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(metrics, indent=2))
    return 0


def cmd_export(args) -> int:
    from rllib_tba.policy_export import export_hf_model

    print(export_hf_model(args.checkpoint, args.out_dir))
    return 0


def cmd_serve(args) -> int:
    from rllib_tba.serve import run_server

    run_server(args.checkpoint, host=args.host, port=args.port, max_tokens_limit=args.max_tokens_limit,
               max_n=args.max_n)
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="rllib", description="rllib-tba: train, evaluate, serve and export RLlib LLM policies.")
    sub = ap.add_subparsers(dest="command", required=True)

    train = sub.add_parser("train", help="train from a tuned-example file under Ray Tune")
    train_sub = train.add_subparsers(dest="source", required=True)
    f = train_sub.add_parser("file", help="a .py file defining `config` (AlgorithmConfig) and optionally `stop`")
    f.add_argument("path")
    f.add_argument("--stop", type=_json_arg, default=None, help="Tune stop criteria as JSON; overrides the file's `stop`")
    f.add_argument("--checkpoint-freq", type=int, default=0, help="checkpoint every N iterations (0: never)")
    f.add_argument("--checkpoint-at-end", action=argparse.BooleanOptionalAction, default=True)
    f.add_argument("--storage-path", default="results", help="where Tune writes results, TensorBoard files, checkpoints")
    f.add_argument("--name", help="experiment name (default: the file's stem)")
    f.add_argument("--num-env-runners", type=int, help="override config.num_env_runners")
    f.add_argument("--num-cpus", type=int, default=None, help="CPUs Ray may use (default: all)")
    f.add_argument("--restore", help="start from this algorithm checkpoint (weights, optimizer, buffer, counters)")
    f.add_argument("--resume", action="store_true", help="resume an interrupted experiment of the same name")
    f.add_argument("--verbose", type=int, default=1, choices=[0, 1, 2, 3])
    f.set_defaults(func=cmd_train)

    ev = sub.add_parser("evaluate", help="task metrics of a checkpoint's policy on N samples")
    ev.add_argument("checkpoint")
    ev.add_argument("--num-samples", type=int, default=256)
    ev.add_argument("--temperature", type=float, help="default: the checkpoint's sampling_temperature")
    ev.add_argument("--greedy", action="store_true", help="greedy decoding (math: pass@1)")
    ev.add_argument("--seed", type=int, default=0)
    ev.add_argument("--env-config", type=_json_arg, help="env_config overrides, e.g. held-out problems: "
                    "'{\"dataset_seed\": 1}'")
    ev.add_argument("--base-model", action="store_true", help="evaluate the run's starting model instead")
    ev.add_argument("--json", help="also write the metrics to this file")
    ev.set_defaults(func=cmd_evaluate)

    sv = sub.add_parser("serve", help="serve a checkpoint's policy over HTTP with Ray Serve + vLLM")
    sv.add_argument("checkpoint")
    sv.add_argument("--host", default="127.0.0.1")
    sv.add_argument("--port", type=int, default=8000)
    sv.add_argument("--max-tokens-limit", type=int, default=512)
    sv.add_argument("--max-n", type=int, default=16)
    sv.set_defaults(func=cmd_serve)

    ex = sub.add_parser("export", help="write a checkpoint's policy as a Hugging Face model directory")
    ex.add_argument("checkpoint")
    ex.add_argument("out_dir")
    ex.set_defaults(func=cmd_export)
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    import envs  # noqa: F401  (registers the tba/* environments)
    import rllib_tba  # noqa: F401  (registers TBA with Tune)

    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
