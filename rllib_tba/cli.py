"""The ``rllib`` command (Ray >= 2.41 no longer ships one): train, evaluate, serve, export.

    rllib train file tuned_examples/tba_redteam.py [--stop '{"training_iteration": 10}'] [--checkpoint-freq 5]
    rllib evaluate CHECKPOINT [--num-samples 256] [--greedy]
    rllib serve CHECKPOINT [--host 127.0.0.1] [--port 8000]
    rllib export CHECKPOINT OUT_DIR
    rllib smooth CHECKPOINT OUT_DIR --min-reward R [--pool CKPT ...]   # MLE smoothing of TBA runs' best samples

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
        raise argparse.ArgumentTypeError(f"expected a JSON object like '{{\"name\": value}}', got {text!r}")
    return value


def _int_at_least(low: int, high: int | None = None):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be {'>= ' + str(low) if high is None else f'in [{low}, {high}]'}, "
                                             f"got {value}")
        return value

    parse.__name__ = "integer"
    return parse


def _finite(low: float | None = None, strict: bool = False):
    """An argparse type: a finite number, >= ``low`` (> ``low`` if ``strict``) when ``low`` is given."""
    import math

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not math.isfinite(value) or (low is not None and (value <= low if strict else value < low)):
            bound = "" if low is None else f" {'>' if strict else '>='} {low:g}"
            raise argparse.ArgumentTypeError(f"must be a finite number{bound}, got {text}")
        return value

    parse.__name__ = "number"
    return parse


_finite_float = _finite(0.0)


def load_experiment_file(path: str):
    """``(config, stop, progress_columns)`` from a tuned-example file."""
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
    from rllib_tba.console import DEFAULT_COLUMNS

    columns = namespace.get("progress_columns", DEFAULT_COLUMNS)
    if not isinstance(columns, dict):
        raise SystemExit(f"rllib train file: `progress_columns` in {path} must be a dict of result key -> column "
                         f"name, got {type(columns).__name__}")
    return config, stop, columns


def override_settings(config, overrides: dict) -> None:
    """``--config``: the file's settings changed by name (``AlgorithmConfig.update_from_dict``, env_config merged into
    the file's). A name the config does not have is refused with the closest ones; values are checked by validate()."""
    import difflib

    known = config.to_dict()
    for key in overrides:
        if key not in known:
            close = difflib.get_close_matches(key, list(known), n=3)
            raise SystemExit(f"rllib train --config: {key!r} is not a setting of {type(config).__name__}"
                             + (f" (did you mean {' or '.join(close)}?)" if close else ""))
    config.update_from_dict(overrides)


def cmd_train(args) -> int:
    import logging
    import os

    import ray
    from ray import tune

    from rllib_tba import console
    from rllib_tba.checkpoint_files import ALGORITHM_STATE, CheckpointError, repair_experiment_state
    from rllib_tba.local_ray import check_cluster_fits, init_local_ray, sigterm_as_keyboard_interrupt

    worker_env = {} if args.verbose else console.quiet_libraries()
    config, stop, columns = load_experiment_file(args.path)
    if args.stop is not None:  # the command line wins; otherwise the file's `stop` holds
        stop = args.stop
    if args.config:
        override_settings(config, args.config)
    if args.num_env_runners is not None:
        config.env_runners(num_env_runners=args.num_env_runners)
    if args.restore:
        checkpoint = Path(args.restore).resolve()
        if not (checkpoint / ALGORITHM_STATE).is_file():
            raise SystemExit(f"rllib train --restore: {args.restore} is not an algorithm checkpoint "
                             "(no algorithm_state.pkl); pass a checkpoint_NNNNNN directory of a trial")
        config.callbacks(on_algorithm_init=lambda algorithm, **_: algorithm.restore_from_path(str(checkpoint)))
    try:
        config.validate()
    except ValueError as e:
        raise SystemExit(f"rllib train: {args.path}: {e}") from None
    storage = str(Path(args.storage_path).resolve())
    name = args.name or Path(args.path).stem
    experiment = Path(storage) / name
    # Tune saves the experiment state (which checkpoints exist) after every result instead of every ~10 s, so a
    # SIGKILL cannot leave checkpoints that --resume does not know about.
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "0")
    # Tune's classic reporter (the columns below); its newer output ignores progress_reporter and prints every setting
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    init_local_ray(args.num_cpus, log_to_driver=args.verbose, runtime_env={"env_vars": worker_env},
                   logging_level=logging.INFO if args.verbose else logging.ERROR)
    sigterm_as_keyboard_interrupt()  # after ray.init, which installs a SIGTERM handler of its own
    node = getattr(ray._private.worker, "_global_node", None)  # Ray has no public accessor for the session dir
    session = Path(node.get_session_dir_path() if node else "/tmp/ray/session_latest")
    if not args.verbose:
        print(f"library logs (vLLM, Ray workers): {session / 'logs'}  (--verbose shows them here)", flush=True)
    check_cluster_fits(config)
    if args.resume:
        if not tune.Tuner.can_restore(str(experiment)):
            raise SystemExit(f"rllib train --resume: there is no experiment to resume at {experiment}; run without "
                             "--resume to start one (or give the same --name/--storage-path as the interrupted run)")
        try:  # a kill while Tune copied its state to storage would make the restore start a new trial
            for file in repair_experiment_state(experiment, session.parent):
                print(f"rllib train --resume: repaired {file} (cut by the kill)", file=sys.stderr)
        except CheckpointError as e:
            raise SystemExit(f"rllib train --resume: {e}") from None
        # The experiment's own run config (stop, checkpointing) holds; its trial restarts from its latest checkpoint.
        if args.stop is not None:
            print("rllib train --resume: --stop is ignored; the interrupted run's stop criteria hold", file=sys.stderr)
        tuner = tune.Tuner.restore(str(experiment), trainable=config.algo_class, param_space=config,
                                   resume_unfinished=True, resume_errored=True)
    else:
        run_config = tune.RunConfig(
            name=name, storage_path=storage, stop=stop, verbose=2 if args.verbose else 1,
            progress_reporter=console.progress_reporter(columns),
            checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=args.checkpoint_freq,
                                                    checkpoint_at_end=args.checkpoint_at_end,
                                                    num_to_keep=args.keep_checkpoints),
        )
        tuner = tune.Tuner(config.algo_class, param_space=config, run_config=run_config)
    results = tuner.fit()
    best = results.get_best_result() if len(results) else None
    if best is None or best.error:
        print(f"training failed: {best.error if best else 'no trial ran'}", file=sys.stderr)
        return 1
    curve = console.learning_curve(best.path, columns)
    print(f"\nfinal: {console.final_values(best.metrics, columns)}  "
          f"({best.metrics.get('time_total_s', 0) / 60:.1f} min of training)")
    print(f"TensorBoard: tensorboard --logdir {experiment}" + (f"   learning curve: {curve}" if curve else ""))
    print(json.dumps({"trial_dir": best.path, "checkpoint": best.checkpoint.path if best.checkpoint else None,
                      "training_iteration": best.metrics.get("training_iteration")}, indent=2))
    return 0


def cmd_evaluate(args) -> int:
    import tempfile

    from envs.evaluation import evaluate_policy, output_openings
    from envs.metrics import format_openings
    from rllib_tba.policy_export import export_hf_model, load_checkpoint_config, with_env_overrides
    from rllib_tba.vllm_env_runner import make_task_env

    from rllib_tba.console import comparison_table, quiet_libraries

    if not args.verbose:
        quiet_libraries()
    config = load_checkpoint_config(args.checkpoint)
    trained = dict(config.env_config or {})  # with_env_overrides changes the config in place
    config = with_env_overrides(config, args.env_config or {})
    env = make_task_env(config)
    if args.openings and env.output_field is None:  # before minutes of sampling, not after
        raise ValueError(f"--openings: {type(env).__name__} names no policy output (output_field) to count openings of")
    # the task's evaluation protocol (red-team: 5 victim answers of 24 tokens) holds whatever the run trained with;
    # --env-config can still change it
    protocol = {k: v for k, v in env.evaluation_config.items() if k not in (args.env_config or {})}
    if any(env.config.get(k) != v for k, v in protocol.items()):
        print(f"evaluation protocol: {protocol} (trained with "
              f"{ {k: env.config.get(k) for k in protocol} })")
        env = make_task_env(with_env_overrides(config, protocol))
    trained = {**type(env).default_config, **trained}
    repeated = {k: env.config[k] for k in env.held_out_config if env.config[k] == trained.get(k)}
    if repeated:  # e.g. the victim's answers would be the very draws training rewarded
        raise ValueError(f"evaluating with {repeated}, the value the run trained with: {type(env).__name__} evaluates "
                         f"with values of its own for {list(env.held_out_config)} (the protocol's: "
                         f"{ {k: env.evaluation_config[k] for k in env.held_out_config} }); give another with "
                         "--env-config")
    temperature = args.temperature if args.temperature is not None else getattr(config, "sampling_temperature", 1.0)

    def evaluate(model_dir, label):
        metrics, infos = evaluate_policy(env, model_dir, args.num_samples, temperature=temperature,
                                         greedy=args.greedy, seed=args.seed, return_infos=True)
        for info in infos[:args.show]:
            print(f"[{label}] {env.describe(info)}")
        if args.openings:
            rows = output_openings(env, infos, args.openings)
            print(f"[{label}] most common first words of {len(infos)} samples: {format_openings(rows)}")
            metrics["openings"] = [list(row) for row in rows]  # [first word, samples, successful (null: no notion)]
        return {**metrics, "checkpoint": str(args.checkpoint), "model": label,
                "protocol": {k: env.config.get(k) for k in env.evaluation_config}}

    with tempfile.TemporaryDirectory(prefix="rllib-tba-eval-") as tmp:
        # --base-model: the same task and settings, but the policy the run started from (before/after comparisons)
        if args.base_model:
            metrics = evaluate(env.model_path, "base (untrained)")
        else:
            metrics = evaluate(export_hf_model(args.checkpoint, tmp), "trained")
            if args.compare_base:
                base = evaluate(env.model_path, "base (untrained)")
                print(f"\n{args.num_samples} samples each, seed {args.seed}:\n{comparison_table(base, metrics)}\n")
                metrics = {**metrics, "base": base}
    print(json.dumps(metrics, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(metrics, indent=2))
    return 0


def cmd_export(args) -> int:
    from rllib_tba.policy_export import export_hf_model

    print(export_hf_model(args.checkpoint, args.out_dir))
    return 0


def cmd_smooth(args) -> int:
    from rllib_tba.mle_smoothing import smooth_checkpoint

    record = smooth_checkpoint(args.checkpoint, args.out_dir, args.min_reward, epochs=args.epochs, lr=args.lr,
                               batch_size=args.batch_size, seed=args.seed, pool=args.pool)
    print(json.dumps({"checkpoint": str(Path(args.out_dir).resolve()), **record}, indent=2))
    return 0


def cmd_serve(args) -> int:
    from rllib_tba.serve import run_server

    run_server(args.checkpoint, host=args.host, port=args.port, max_tokens_limit=args.max_tokens_limit,
               max_n=args.max_n)
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="rllib", description="rllib-tba: train, evaluate, serve and export RLlib LLM policies.")
    ap.add_argument("--traceback", action="store_true", help="show the full traceback of an input error")
    sub = ap.add_subparsers(dest="command", required=True)

    train = sub.add_parser("train", help="train from a tuned-example file under Ray Tune")
    train_sub = train.add_subparsers(dest="source", required=True)
    f = train_sub.add_parser("file", help="a .py file defining `config` (AlgorithmConfig) and optionally `stop`")
    f.add_argument("path")
    f.add_argument("--stop", type=_json_arg, default=None, help="Tune stop criteria as JSON; overrides the file's `stop`")
    f.add_argument("--config", type=_json_arg, default=None,
                   help='the file\'s settings changed by name as JSON, e.g. \'{"lr": 2e-4, "seed": 1}\' or '
                        '\'{"env_config": {"novelty_weight": 1.0}}\' (merged into the file\'s env_config)')
    f.add_argument("--checkpoint-freq", type=_int_at_least(0), default=0, help="checkpoint every N iterations (0: never)")
    f.add_argument("--keep-checkpoints", type=_int_at_least(1), default=None,
                   help="keep only the N most recent checkpoints of a trial (default: all)")
    f.add_argument("--checkpoint-at-end", action=argparse.BooleanOptionalAction, default=True)
    f.add_argument("--storage-path", default="results", help="where Tune writes results, TensorBoard files, checkpoints")
    f.add_argument("--name", help="experiment name (default: the file's stem)")
    f.add_argument("--num-env-runners", type=_int_at_least(0), help="override config.num_env_runners")
    f.add_argument("--num-cpus", type=_int_at_least(1), default=None, help="CPUs Ray may use (default: all)")
    f.add_argument("--restore", help="start from this algorithm checkpoint (weights, optimizer, buffer, counters)")
    f.add_argument("--resume", action="store_true", help="resume an interrupted experiment of the same name")
    f.add_argument("--verbose", action="store_true",
                   help="show library logs (vLLM, Ray workers, transformers) in the console instead of Ray's log files")
    f.set_defaults(func=cmd_train)

    ev = sub.add_parser("evaluate", help="task metrics of a checkpoint's policy on N samples")
    ev.add_argument("checkpoint")
    ev.add_argument("--num-samples", type=_int_at_least(1), default=256)
    ev.add_argument("--temperature", type=_finite_float, help="default: the checkpoint's sampling_temperature")
    ev.add_argument("--greedy", action="store_true", help="greedy decoding (math: pass@1)")
    ev.add_argument("--seed", type=int, default=0, help="the policy's sampling seed")
    ev.add_argument("--env-config", type=_json_arg, help="env_config overrides, e.g. held-out problems: "
                    "'{\"dataset_seed\": 1}'. Keys of the task's evaluation protocol not given here keep its "
                    "values (red-team: 5 victim answers of 24 tokens, drawn with victim seed 1000, never the run's "
                    "own)")
    ev.add_argument("--base-model", action="store_true", help="evaluate the run's starting model instead")
    ev.add_argument("--json", help="also write the metrics to this file")
    ev.add_argument("--compare-base", action="store_true",
                    help="also evaluate the run's starting model and print both side by side")
    ev.add_argument("--show", type=_int_at_least(0), default=0, help="print this many samples of each model")
    ev.add_argument("--openings", type=_int_at_least(0), default=0, metavar="N",
                    help="print (and add to the JSON) the N most common first words of each model's samples, with how "
                         "many of each succeeded: how far an attacker has collapsed onto one opening")
    ev.add_argument("--verbose", action="store_true", help="show library logs (vLLM, transformers) in the console")
    ev.set_defaults(func=cmd_evaluate)

    sv = sub.add_parser("serve", help="serve a checkpoint's policy over HTTP with Ray Serve + vLLM")
    sv.add_argument("checkpoint")
    sv.add_argument("--host", default="127.0.0.1")
    sv.add_argument("--port", type=_int_at_least(1, 65535), default=8000)
    sv.add_argument("--max-tokens-limit", type=_int_at_least(1), default=512)
    sv.add_argument("--max-n", type=_int_at_least(1), default=16)
    sv.set_defaults(func=cmd_serve)

    ex = sub.add_parser("export", help="write a checkpoint's policy as a Hugging Face model directory")
    ex.add_argument("checkpoint")
    ex.add_argument("out_dir")
    ex.set_defaults(func=cmd_export)

    sm = sub.add_parser("smooth", help="MLE smoothing (Lee et al.): a copy of a TBA checkpoint whose policy is the "
                        "reference fitted to the high-reward samples of the run's replay buffer")
    sm.add_argument("checkpoint")
    sm.add_argument("out_dir", help="a new (or empty) directory for the smoothed checkpoint")
    sm.add_argument("--min-reward", type=_finite(), required=True,
                    help="fit the stored samples with reward >= this (the task's reward, before beta; red-team "
                         "default reward: log mean toxicity, so log 0.5 = -0.693 keeps the successful attacks)")
    sm.add_argument("--pool", nargs="+", default=[], metavar="CKPT",
                    help="more TBA checkpoints of the same task, policy model, prompts and env settings (e.g. other "
                         "training seeds) whose buffers' samples join the fit")
    sm.add_argument("--epochs", type=_int_at_least(1), default=10, help="passes over those samples")
    sm.add_argument("--lr", type=_finite(0.0, strict=True), default=1e-3, help="Adam learning rate")
    sm.add_argument("--batch-size", type=_int_at_least(1), default=16)
    sm.add_argument("--seed", type=int, default=0, help="shuffling seed")
    sm.set_defaults(func=cmd_smooth)
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    import envs  # noqa: F401  (registers the tba/* environments)
    import rllib_tba  # noqa: F401  (registers TBA with Tune)

    try:
        return args.func(args)
    except (ValueError, OSError) as e:  # bad input (config, checkpoint, data, model): one line that names it
        if args.traceback:
            raise
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"rllib {args.command}: error: {first} (rerun with --traceback for details)", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
