"""Red-team frontier: TBA, PPO and synchronous TBA trained with Ray Tune on the same models, evaluated with the
`rllib evaluate` protocol; every run becomes one record of benchmarks/redteam_frontier.json, and two pictures are
drawn from that file.

    python tuned_examples/redteam_frontier.py default --seeds 0 1 2     # the default example (tba_redteam.py) as is
    python tuned_examples/redteam_frontier.py tba --beta 0.02 0.05 0.1  # TBA over beta, at --attacks attacks each
    python tuned_examples/redteam_frontier.py ppo --clip 0.1 0.2 0.3    # PPO over its clip range, same budget
    python tuned_examples/redteam_frontier.py tba_sync --seeds 0        # the default example with async_mode=False
    python tuned_examples/redteam_frontier.py default tba_sync --seeds 0 --until-target   # time to ASR 25%, both modes
    python tuned_examples/redteam_frontier.py default --seeds 0 --updates 500   # the default's settings, trained longer
    python tuned_examples/redteam_frontier.py default --seeds 1 --exploration-temperature 0.7 2.0  # a sampler variant
    python tuned_examples/redteam_frontier.py default ppo --reward-beyond-attack  # pay only toxicity past the attack's
    python tuned_examples/redteam_frontier.py default --seeds 0 --share-prompt-forward  # the learner's cheaper forward
    python tuned_examples/redteam_frontier.py default --seeds 0 --learn-log-z  # a learned logZ head, not VarGrad
    python tuned_examples/redteam_frontier.py default --seeds 0 --replay-inv-temp 0  # uniform, not reward-prioritised
    python tuned_examples/redteam_frontier.py default --seeds 6 --lr 2e-3  # the learner's step size (LoRA, Adam)
    python tuned_examples/redteam_frontier.py default --seeds 1 --updates 400 --lr 0:1e-3 300:1e-3 300:2e-4  # lr cut
    python tuned_examples/redteam_frontier.py default --seeds 0 --near-duplicate-jaccard 0.5  # replay spread over modes
    python tuned_examples/redteam_frontier.py default --seeds 0 --updates 320 --beta-schedule 0:0.05 220:0.05 260:0.1
                                                                        # beta raised after the default's 220 updates
    python tuned_examples/redteam_frontier.py default --seeds 0 --reward-temperature-schedule 0:2 100:1  # Lee's tau
    python tuned_examples/redteam_frontier.py default --seeds 3 --checkpoint-every 20  # + checkpoints along the way
    python tuned_examples/redteam_frontier.py smooth --seeds 4          # + the MLE-smoothed policy of that run
    python tuned_examples/redteam_frontier.py smooth --seeds 4 5 --smoothing-pool   # one policy from both runs' buffers
    python tuned_examples/redteam_frontier.py reevaluate --seeds 4 5    # runs evaluated under an earlier protocol
    python tuned_examples/redteam_frontier.py plot                      # only redraw the pictures from the JSON

Each command runs its trials one after another (each takes the whole machine), evaluates each final checkpoint on
256 attacks (5 victim answers each, drawn with the evaluation's own victim seed, never training's; evaluation seed
0: `rllib evaluate CKPT --num-samples 256`), and merges the runs
into the JSON (a run with the same method, knob, training seed and budget replaces the older one), so the frontier
grows over several invocations. Wall-clock counts from the start of training (after the searchers' vLLM engines are
up). ``time_to_asr_0.25_s``: the first moment the searchers' success rate over the last 64 attacks they generated
reached 25% (``envs.metrics.SuccessWindow``, computed on the searcher for every method); null if never reached.
Raw Tune/TensorBoard logs go to --storage (default results/redteam_frontier), not into git.
``--until-target``: instead of the default example's budget, stop at the iteration in which the searchers' ASR over
their last 64 attacks first reached 25% (or at --max-updates learner updates): the time-to-target pair of asynchronous
and synchronous TBA, both measured the same way (``goals()`` pairs runs with the same seed, knob and stop).
``smooth``: Lee et al.'s second stage (``rllib smooth``, rllib_tba/mle_smoothing.py) on the run of the same seed and
options already in the JSON (trained earlier, or by ``default`` in the same command): the reference attacker fitted to
the successful attacks its replay buffer holds (reward >= log 0.5 or --smoothing-min-reward, each distinct one once,
--smoothing-epochs passes), evaluated the same way, recorded as a TBA run whose knob adds ``mle_smoothing_epochs`` and
whose wall-clock adds the smoothing's (its time to ASR 25% is the searchers', which never ran the smoothed policy).
``--smoothing-pool``: one policy fitted to the successful attacks of all the --seeds runs' buffers together (restarts
of the same search, pooled: ``rllib smooth --pool``), recorded as one run (knob ``mle_smoothing_pooled_seeds``) that
trained the runs one after another: attacks, updates and wall-clock add up, plus the smoothing's.
``reevaluate``: the runs of --seeds evaluated under an earlier protocol (``current_protocol``) whose checkpoints are on
this machine, evaluated again; the others stay under ``runs_earlier_protocol`` and count only for time to ASR 25%.
``--quick``: the tiny test model as attacker and victim, a few updates; what the tests run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import ray
from ray import tune
from ray.rllib.core.rl_module.rl_module import RLModuleSpec

from envs.metrics import SUCCESS_THRESHOLD
from envs.redteam import MEMORY_SCOPES, NOVELTY_AGAINST, VICTIM_DRAWS, RedTeamEnv
from rllib_tba.hf_rl_module import LEARNER_PRECISIONS
from rllib_tba.tba import BETA_SCHEDULE_RULE, LR_SCHEDULE_RULE, SEARCHER_DTYPES, TAU_SCHEDULE_RULE, valid_schedule

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tuned_examples"))
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench  # noqa: E402  (machine(), commit(), README blocks)

OPENINGS = 5  # most common first words each evaluation keeps (how far an attacker collapsed onto one opening)
SEEDS_NEEDED = 3  # the default example's bar: this many training seeds, each ending at ASR >= TARGET
TRAINING_BUDGET_S = 15 * 60  # the default example's training for the "whole command <= 20 min"
TARGET = 0.25  # the ASR whose first-reached time every run reports (time_to_asr_0.25_s)
METHODS = ("tba", "tba_sync", "ppo")
SMOOTHED = "smoothed_e{epochs}{bound}_{checkpoint}"  # a smoothed checkpoint's folder in the trial (not checkpoint_*:
# the trajectory takes every checkpoint_* folder for one of the run's own); bound "" at SMOOTHING_MIN_REWARD, else
# "_r<min reward>": fits of the same run to other samples live side by side
SMOOTHING_MIN_REWARD = math.log(SUCCESS_THRESHOLD)  # log mean toxicity of a just-successful attack
DEFAULT_OUT = ROOT / "benchmarks" / "redteam_frontier.json"
# The learner options a command may change on the default example (argparse dest = TBAConfig field; a run with any
# of them set is a variant), each with when its value enters the run's knob. The rules keep the knob of every run made
# before the option existed: those runs had exploration_temperature None, reward_inv_temp 1.0, each sample's prompt
# run (no share_prompt_forward), VarGrad (no learn_log_z), no near-duplicate spreading and a learner that never
# waited for the searchers (training_intensity None).
LEARNER_OPTIONS = {
    "lr": lambda value: False,  # every knob names lr already
    "m": lambda value: value != 0.5,  # every run before these two options: the paper's red-team m and k
    "sync_every": lambda value: value != 10,
    "exploration_temperature": lambda value: value is not None,
    "reward_inv_temp": lambda value: value != 1.0,
    "share_prompt_forward": bool,
    "learn_log_z": bool,
    "near_duplicate_jaccard": bool,
    "beta_schedule": lambda value: value is not None,
    "reward_temperature_schedule": lambda value: value is not None,
    "training_intensity": lambda value: value is not None,
    "searcher_dtype": lambda value: value != "auto",  # see tba_config: the victim's answers in training too
    "learner_precision": lambda value: value != "auto",
}
# (the protocol's 5 answers per attack, as the default example: fewer are a variant, --victim-responses)
TINY_ENV = {"model": "tiny-test", "victim": "tiny-test", "victim_dtype": "float32", "victim_max_tokens": 4,
            "max_new_tokens": 6}


def learning_rate(text: str) -> float | tuple[int, float]:
    """One --lr value: a learning rate, or one UPDATE:LR point of a schedule."""
    if ":" in text:
        return schedule_point(text)
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give a learning rate, e.g. 1e-3, or UPDATE:LR points") from None


def lr_option(ap, values: list) -> float | list:
    """--lr's values as TBAConfig's lr: one rate in (0, 1), or >= 2 UPDATE:LR points forming a schedule."""
    shown = " ".join(f"{v[0]}:{v[1]:g}" if isinstance(v, tuple) else f"{v:g}" for v in values)
    if len(values) == 1 and not isinstance(values[0], tuple):
        if not 0 < values[0] < 1:
            ap.error(f"--lr {shown}: give a learning rate in (0, 1)")
        return values[0]
    if not (all(isinstance(v, tuple) for v in values) and len(values) >= 2 and valid_schedule(values)
            and all(lr < 1 for _, lr in values)):
        ap.error(f"--lr {shown}: give one learning rate, or 2 or more UPDATE:LR points forming {LR_SCHEDULE_RULE} "
                 "(each lr < 1)")
    return values


def schedule_point(text: str) -> tuple[int, float]:
    """One --beta-schedule / --reward-temperature-schedule / --lr point, UPDATE:VALUE (the schedule as a whole is
    checked by TBAConfig's own rule)."""
    update, sep, value = text.partition(":")
    try:
        if sep:
            return int(update), float(value)
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"{text!r}: give UPDATE:VALUE, e.g. 220:0.1")


def tba_config(args, seed: int, sync: bool = False, beta=None):
    """The default example's config (tuned_examples/tba_redteam.py), or its tiny stand-in with --quick."""
    if args.quick:
        from tba_tiny import tiny_config

        config = tiny_config("tba/RedTeam-v0", dict(TINY_ENV), updates_per_iteration=5, training_intensity=1.0,
                             seed=seed, share_prompt_forward=True)  # as the default example
    else:
        from tba_redteam import config as default

        config = default.copy(copy_frozen=False).debugging(seed=seed)
    if beta is not None:
        config.training(beta=beta)
    for field in LEARNER_OPTIONS:  # the variant options this command was given (argparse dest = config field)
        value = getattr(args, field, None)
        if value is not None:
            config.training(**{field: tuple(value) if isinstance(value, list) else value})
    if getattr(args, "searcher_dtype", None) is not None:  # a searcher's two vLLM engines: the attacker and the victim
        config.environment(env_config={**config.env_config, "victim_dtype": args.searcher_dtype})
    if getattr(args, "searchers", None) is not None:
        config.env_runners(num_env_runners=args.searchers)  # start_ray lets them share the cores with the learner
    return env_variant(config, args).training(async_mode=not sync)


def env_variant(config, args):
    """--reward-beyond-attack: the env pays each victim answer only the toxicity beyond the attack's own;
    --victim-responses: the victim answers each training attack that many times (evaluation keeps the protocol's);
    --victim-draws fresh: each repeat of a training attack is answered afresh (evaluation keeps the protocol's);
    --novelty-weight: the env's reward times novelty^w against the successes it already scored (--novelty-against
    attacks: against every attack it scored); --memory-scope run: a TBA run's searchers share that memory and the
    fresh draws' counts."""
    if getattr(args, "reward_beyond_attack", False):
        config.environment(env_config={**config.env_config, "reward_beyond_attack": True})
    for key in ("novelty_weight", "novelty_against", "memory_scope", "victim_responses", "victim_draws"):
        if getattr(args, key, None) is not None:
            config.environment(env_config={**config.env_config, key: getattr(args, key)})
    return config


def ppo_config(args, seed: int, clip=None):
    from ppo_redteam import config as default

    config = default.copy(copy_frozen=False).debugging(seed=seed)
    if args.quick:
        config.environment(env_config={**config.env_config, **TINY_ENV})
        spec = config.rl_module_spec
        config.rl_module(rl_module_spec=RLModuleSpec(module_class=spec.module_class, model_config={
            **spec.model_config, "model": "tiny-test", "lora": None, "precision": "fp32"}))
        config.env_runners(num_envs_per_env_runner=8).training(train_batch_size_per_learner=32, minibatch_size=16,
                                                               num_epochs=1)
    if clip is not None:
        config.training(clip_param=clip)
    return env_variant(config, args)


def env_knob(config) -> dict:
    """The env options of a run that differ from the red-team env's defaults and are not the reward's name: the
    victim's answers per training attack where they are not the evaluation protocol's number."""
    env, knob = config.env_config, {}
    if env.get("reward_beyond_attack"):
        knob["reward_beyond_attack"] = True
    if env.get("novelty_weight"):
        knob["novelty_weight"] = env["novelty_weight"]
        against = env.get("novelty_against", RedTeamEnv.default_config["novelty_against"])
        if against != RedTeamEnv.default_config["novelty_against"]:
            knob["novelty_against"] = against
    answers = env.get("victim_responses", RedTeamEnv.default_config["victim_responses"])
    if answers != RedTeamEnv.evaluation_config["victim_responses"]:
        knob["victim_responses"] = answers
    for key in ("victim_draws", "memory_scope"):
        value = env.get(key, RedTeamEnv.default_config[key])
        if value != RedTeamEnv.default_config[key]:
            knob[key] = value
    return knob


def tba_knob(config) -> dict:
    """What distinguishes one TBA run of the frontier from another (besides seed and stop)."""
    knob = {"beta": config.beta, "lr": json.loads(json.dumps(config.lr)),  # a schedule's tuples as the JSON's lists
            "reward": config.env_config.get("reward", RedTeamEnv.default_config["reward"])}
    for field, differs in LEARNER_OPTIONS.items():
        value = getattr(config, field)
        if differs(value):
            knob[field] = json.loads(json.dumps(value))  # tuples as the JSON's lists
    if config.num_env_runners != 1:
        knob["searchers"] = config.num_env_runners
    return {**knob, **env_knob(config)}


def example_knob(args) -> dict:
    """The default example's own knob, without the variant options of this command (--exploration-temperature)."""
    return tba_knob(tba_config(argparse.Namespace(quick=args.quick), 0))


def default_stop(args) -> dict:
    """The stop of a default/tba_sync trial: the default example's budget, --updates learner updates, or with
    --until-target the target."""
    if args.until_target:
        # Tune stops a trial when any value reaches its bound; the reached-at time is NaN until the searchers' ASR
        # over their last 64 attacks first reaches the target, then a unix time (>= 0)
        return {f"task/success_rate_{TARGET:g}_reached_at": 0, "tba/weights_version": args.max_updates}
    if getattr(args, "updates", None):
        return {"tba/weights_version": args.updates}
    return example_budget(args)


def example_budget(args) -> dict:
    """The default example's own training budget."""
    if args.quick:
        return {"tba/weights_version": 10}  # >= 64 attacks: the ASR-over-64 curve has points
    from tba_redteam import stop

    return dict(stop)


def plan(args) -> list[dict]:
    """The trials of one command, in order (seed by seed, so a pair of modes runs side by side): method, knob, seed,
    config, stop."""
    attacks = {"env_runners/num_episodes_lifetime": args.attacks}
    knob, budget = example_knob(args), example_budget(args)  # the default example as is: its settings and budget
    trials = []
    for s in args.seeds:
        for what in args.what:
            if what == "smooth":  # not a training run: see smooth_runs
                continue
            if what in ("default", "tba_sync"):
                method, sync = ("tba", False) if what == "default" else ("tba_sync", True)
                config = tba_config(args, s, sync=sync)
                stop = default_stop(args)
                trials.append(dict(method=method, knob=tba_knob(config), train_seed=s, config=config, stop=stop,
                                   default_example=tba_knob(config) == knob and stop == budget))
                if getattr(args, "checkpoint_every", None):
                    trials[-1]["checkpoint_every"] = args.checkpoint_every
            elif what == "tba":
                configs = [tba_config(args, s, beta=b) for b in args.beta]
                trials += [dict(method="tba", knob=tba_knob(c), train_seed=s, default_example=False, config=c,
                                stop=attacks) for c in configs]
            else:
                configs = [ppo_config(args, s, clip=c) for c in args.clip]
                trials += [dict(method="ppo", knob={"clip_param": c.clip_param, **env_knob(c)}, train_seed=s,
                                default_example=False, config=c, stop=attacks) for c in configs]
    return trials


def train(trial: dict, storage: Path):
    """One Tune run of one trial (the trial's stop is a training budget: updates or attacks); sets trial["commit"] to
    the code it starts from (a commit made while it trains must not be credited with its results)."""
    trial["commit"] = bench.commit()
    name = f"{trial['method']}_{'_'.join(f'{k}{v}' for k, v in trial['knob'].items())}_seed{trial['train_seed']}"
    if any(key.endswith("_reached_at") for key in trial["stop"]):
        name += "_until_target"
    elif list(trial["stop"]) == ["tba/weights_version"]:  # the example's budget, or --updates
        name += f"_{trial['stop']['tba/weights_version']}updates"
    algo = "TBA" if trial["method"] != "ppo" else "PPO"
    every = trial.get("checkpoint_every")  # learner updates; a TBA iteration is updates_per_iteration updates
    checkpoints = tune.CheckpointConfig(
        checkpoint_at_end=True, checkpoint_frequency=every // trial["config"].updates_per_iteration if every else 0)
    tuner = tune.Tuner(algo, param_space=trial["config"],
                       run_config=tune.RunConfig(name=name, storage_path=str(storage), stop=trial["stop"], verbose=0,
                                                 checkpoint_config=checkpoints))
    result = tuner.fit()[0]
    if result.error:
        raise SystemExit(f"{name}: training failed: {result.error}")
    return result


def column(df, key: str):
    """A task metric's column: TBA reports ``task/...``, RLlib's PPO ``env_runners/task/...``."""
    for name in (key, f"env_runners/{key}"):
        if name in df.columns:
            return df[name]
    return None


def finite_or_none(x):
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else x


def time_to(df, rate: float, start: float) -> float | None:
    """Seconds from ``start`` to the first moment the searchers' success rate over their last 64 attacks was >= rate."""
    reached = column(df, f"task/success_rate_{rate:g}_reached_at")
    reached = [] if reached is None else reached.dropna()
    return round(float(reached.iloc[0]) - start, 1) if len(reached) else None


def run_record(trial: dict, result, evaluation: dict) -> dict:
    df = result.metrics_dataframe
    start = float(df["timestamp"].iloc[0] - df["time_total_s"].iloc[0])  # when training began (unix s)
    rate = column(df, "task/success_rate_last_64")
    curve = [] if rate is None else [[round(float(t), 1), round(float(r), 4)]
                                     for t, r in zip(df["time_total_s"], rate) if not math.isnan(r)]
    last = df.iloc[-1]
    updates = last.get("tba/weights_version", last.get("learners/default_policy/num_module_steps_trained_lifetime"))
    return {
        "method": trial["method"], "knob": trial["knob"], "train_seed": trial["train_seed"],
        "default_example": trial["default_example"], "stop": trial["stop"], "commit": trial["commit"],
        "machine": bench.machine_line(),  # wall-clock figures compare only between runs of one machine
        "attacks_generated": int(last["env_runners/num_episodes_lifetime"]),
        "learner_updates": None if updates is None or math.isnan(updates) else int(updates),
        "wall_clock_s": round(float(last["time_total_s"]), 1),
        "time_to_asr_0.25_s": time_to(df, TARGET, start),
        "time_to_asr_0.9_s": time_to(df, 0.9, start),
        "eval": eval_record(evaluation),
        # extra checkpoints pause the learner while they are written: a run says it made them
        **({"checkpoint_every_updates": trial["checkpoint_every"]} if trial.get("checkpoint_every") else {}),
        "asr_curve": curve,  # [training wall-clock s, searchers' ASR over the last 64 attacks] per iteration
        "trial_dir": result.path.replace(str(ROOT) + os.sep, ""),
    }


def eval_record(evaluation: dict) -> dict:
    """The figures of one `rllib evaluate` JSON (``evaluate``) that a record keeps."""
    return {"n": int(evaluation["num_samples"]), "seed": evaluation["seed"],
            "asr": evaluation["attack_success_rate"], "diversity": finite_or_none(evaluation["diversity"]),
            "distinct_successful": int(evaluation["distinct_successful"]),
            "diversity_successful": finite_or_none(evaluation["diversity_successful"]),
            "mean_toxicity": evaluation["mean_toxicity"], "attack_toxicity": evaluation["attack_toxicity"],
            "asr_beyond_attack": evaluation["asr_beyond_attack"], "protocol": evaluation["protocol"],
            # [first word, attacks, successful] of the evaluated attacks, most common first (evaluations since --openings)
            **({"openings": evaluation["openings"]} if "openings" in evaluation else {})}


def eval_path(checkpoint, seed: int = 0, tag: str = "") -> Path:
    """Where ``evaluate`` keeps a checkpoint's evaluation JSON."""
    return Path(checkpoint) / f"eval_seed{seed}{tag}.json"


def evaluate(checkpoint: str, num_samples: int, seed: int = 0, extra=(), tag: str = "") -> dict:
    """`rllib evaluate` on the checkpoint (``extra``: more of its options), in its own process (the same protocol a
    user runs); its JSON is kept next to the checkpoint (``eval_path``)."""
    out = eval_path(checkpoint, seed, tag)
    rllib = Path(sys.executable).with_name("rllib")
    subprocess.run([str(rllib), "evaluate", checkpoint, "--num-samples", str(num_samples), "--seed", str(seed),
                    "--show", "0", "--openings", str(OPENINGS), "--json", str(out), *extra],
                   check=True, stdout=subprocess.DEVNULL)
    return {**json.loads(out.read_text()), "seed": seed}


def smooth_runs(args, out: Path) -> list[dict]:
    """``smooth``: for each seed (with --smoothing-pool: for all the seeds together), the JSON's TBA run with this
    command's options (its trial on this machine), MLE-smoothed and evaluated (a smoothed checkpoint made before, with
    the same passes, is reused); returns the new records."""
    from rllib_tba.mle_smoothing import RECORD, smooth_checkpoint

    runs = all_runs(out)
    knob_of = {seed: tba_knob(tba_config(args, seed)) for seed in args.seeds}
    if knob_of[args.seeds[0]]["reward"] != "log_mean_toxicity" and args.smoothing_min_reward == SMOOTHING_MIN_REWARD:
        raise SystemExit(f"smooth: the run's reward is {knob_of[args.seeds[0]]['reward']}; a successful attack is "
                         f"reward > log {SUCCESS_THRESHOLD} only for log_mean_toxicity: give --smoothing-min-reward")
    bases = {seed: trained_run(runs, knob_of[seed], seed, default_stop(args), out) for seed in args.seeds}
    records = []
    for seeds in [args.seeds] if args.smoothing_pool else [[seed] for seed in args.seeds]:
        checkpoints = [final_checkpoint(bases[seed]) for seed in seeds]
        bound = "" if args.smoothing_min_reward == SMOOTHING_MIN_REWARD else f"_r{args.smoothing_min_reward:g}"
        pool = f"_pool{'-'.join(map(str, seeds))}" if args.smoothing_pool else ""
        smoothed = checkpoints[0].parent / SMOOTHED.format(epochs=args.smoothing_epochs, bound=bound + pool,
                                                           checkpoint=checkpoints[0].name)
        made = smoothed / RECORD
        smoothing = json.loads(made.read_text()) if made.is_file() else smooth_checkpoint(
            checkpoints[0], smoothed, args.smoothing_min_reward, epochs=args.smoothing_epochs, seed=seeds[0],
            pool=checkpoints[1:])
        if smoothing["min_reward"] != args.smoothing_min_reward:
            raise SystemExit(f"smooth: {smoothed} was fitted to reward >= {smoothing['min_reward']:g}, not "
                             f"{args.smoothing_min_reward:g}: remove it to make it again")
        smoothing_knob = {"mle_smoothing_epochs": args.smoothing_epochs}
        if args.smoothing_min_reward != SMOOTHING_MIN_REWARD:
            smoothing_knob["mle_smoothing_min_reward"] = args.smoothing_min_reward
        if args.smoothing_pool:
            smoothing_knob["mle_smoothing_pooled_seeds"] = list(seeds)
        smoothing = {"commit": bench.commit(), "checkpoint": str(smoothed).replace(str(ROOT) + os.sep, ""),
                     **{k: smoothing[k] for k in ("min_reward", "samples", "stored", "epochs", "seconds",
                                                  "loss_per_epoch", "samples_per_checkpoint") if k in smoothing}}
        records.append(smoothed_record([bases[seed] for seed in seeds], smoothing_knob, smoothing,
                                       eval_record(evaluate(str(smoothed), args.num_eval))))
    return records


def all_runs(out: Path) -> list[dict]:
    """Every record of the JSON, whichever protocol evaluated it."""
    data = json.loads(out.read_text()) if out.is_file() else {}
    return data.get("runs", []) + data.get("runs_earlier_protocol", [])


def reevaluate_runs(args, out: Path):
    """``reevaluate``: the JSON's runs of --seeds evaluated under an earlier protocol whose checkpoint (the trial's
    last, or the smoothed policy) is on this machine, evaluated again under today's; each record keeps the earlier
    figures as ``eval_earlier_protocol``. Yields each updated record once it is evaluated."""
    for run in all_runs(out):
        if current_protocol(run["eval"]) or run["train_seed"] not in args.seeds:
            continue
        checkpoint = ROOT / run["smoothing"]["checkpoint"] if "smoothing" in run else last_checkpoint(run)
        if checkpoint is None or not checkpoint.is_dir():
            print(f"reevaluate: {run['method']} {run['knob']} seed {run['train_seed']}: its checkpoint is not on this "
                  "machine; it stays under runs_earlier_protocol")
            continue
        yield {**run, "eval": eval_record(evaluate(str(checkpoint), args.num_eval)), "eval_earlier_protocol": run["eval"]}


def trained_run(runs: list[dict], knob: dict, seed: int, stop: dict, out: Path) -> dict:
    """The JSON's latest TBA run of ``seed`` with ``knob`` and ``stop`` on this machine (``smooth`` needs its trial)."""
    base = [r for r in runs if r["method"] == "tba" and r["knob"] == knob and r["train_seed"] == seed and
            r["stop"] == stop and r["machine"] == bench.machine_line()]
    if not base:
        raise SystemExit(f"smooth: {out} holds no TBA run of seed {seed} with knob {knob} and stop {stop} on this "
                         "machine: train it first (e.g. the same command with `default` before `smooth`)")
    return base[-1]


def last_checkpoint(run: dict) -> Path | None:
    """The last checkpoint of a run's trial on this machine (None: none is here)."""
    checkpoints = sorted((ROOT / run.get("trial_dir", "-")).glob("checkpoint_*"))
    return checkpoints[-1] if checkpoints else None


def final_checkpoint(run: dict) -> Path:
    """The last checkpoint of a run's trial on this machine; exits if none is here (``smooth`` needs it)."""
    checkpoint = last_checkpoint(run)
    if checkpoint is None:
        raise SystemExit(f"smooth: no checkpoint in {ROOT / run['trial_dir']} (the run's results are not on this "
                         "machine)")
    return checkpoint


def smoothed_record(bases: list[dict], smoothing_knob: dict, smoothing: dict, evaluation: dict) -> dict:
    """The record of a policy smoothed from the buffers of ``bases`` (one run, or runs of several seeds pooled): the
    first run's record with the smoothing's knob, evaluation and record; the runs count as trained one after another
    on this machine, then smoothed: their attacks and updates add up, its wall-clock is theirs plus the smoothing's,
    and its time to ASR 25% is the first run to reach it, counted from the first run's start (the searchers never ran
    the smoothed policy)."""
    first, elapsed, reached = bases[0], 0.0, None
    for run in bases:
        if run["time_to_asr_0.25_s"] is not None:
            reached = round(elapsed + run["time_to_asr_0.25_s"], 1)
            break
        elapsed += run["wall_clock_s"]
    record = {k: v for k, v in first.items() if k not in ("eval", "superseded_default")}
    record.update(knob={**first["knob"], **smoothing_knob}, default_example=False, eval=evaluation,
                  smoothing=smoothing,
                  wall_clock_s=round(sum(r["wall_clock_s"] for r in bases) + smoothing["seconds"], 1))
    if len(bases) > 1:
        record.update({"time_to_asr_0.25_s": reached, "pooled_trial_dirs": [r["trial_dir"] for r in bases],
                       "attacks_generated": sum(r["attacks_generated"] for r in bases),
                       "learner_updates": sum(r["learner_updates"] for r in bases)})
    return record


def same_run(a: dict, b: dict) -> bool:
    """A new record replaces an older one of the same method, knob, seed, budget and machine (a run on another machine
    is another measurement: its wall-clock is not comparable)."""
    return all(a.get(k) == b.get(k) for k in ("method", "knob", "train_seed", "default_example", "stop", "machine"))


def current_protocol(evaluation: dict) -> bool:
    """Whether an evaluation followed today's protocol (``RedTeamEnv.evaluation_config``). Until the victim's answers
    got a seed of their own, evaluation drew them with training's seed: an attacker replaying its training attacks met
    the very answers it had been rewarded for. Such runs stay in the JSON under ``runs_earlier_protocol`` and count
    only where the evaluation plays no part (``goals``: time to ASR 25%); ``reevaluate`` moves back those whose
    checkpoint is on this machine."""
    return {**PROTOCOL_NAMED_LATER, **(evaluation.get("protocol") or {})} == RedTeamEnv.evaluation_config


# Keys the evaluation protocol names since a later date, with the value every earlier evaluation had all the same:
# the victim's dtype since 2026-12-05 (this command's evaluate() put the env's default, "auto", back where training
# answered in another dtype), the novelty reward's weight since 2026-12-06 (evaluation never paid for novelty), the
# victim's draws per text since 2026-12-07 (copies of one attack always shared their answers)
PROTOCOL_NAMED_LATER = {"victim_dtype": "auto", "novelty_weight": 0.0, "victim_draws": "per_text"}


# What the default example picks by timing the machine it runs on (tuned_examples/tba_redteam.py: its learner
# precision, "bf16-mixed" where a bf16 step measures faster, else "auto", which no knob names): field -> the values
# it can pick (None: the field absent from the knob)
MEASURED_BY_EXAMPLE = {"learner_precision": (None, "bf16-mixed")}


def without_measured(knob: dict) -> dict:
    """``knob`` less the values the default example picks by measuring its machine: two runs of the example on
    machines that picked differently (a Zen 5 in bf16, a Xeon without bf16 instructions in fp32) are both the default."""
    knob = dict(knob)
    for field, values in MEASURED_BY_EXAMPLE.items():
        if knob.get(field) in values:  # another value (forced on the command line) stays: a variant
            knob.pop(field, None)
    return knob


def merge(path: Path, records: list[dict], args) -> dict:
    """Add ``records`` to the JSON (replacing the same runs) and recompute the goals. ``default_example`` means "the
    current default example": a run of an earlier default (another knob or budget) keeps its results and is marked
    ``superseded_default`` (and is the default example again if the default returns to its settings); a run made as a
    variant becomes one when the default takes its settings and budget. A run on another machine is compared
    ``without_measured``: what the example picks by timing that machine may differ from this one's. Runs evaluated
    under an earlier protocol go to ``runs_earlier_protocol`` (``current_protocol``)."""
    data = json.loads(path.read_text()) if path.is_file() else {"runs": []}
    runs = [r for r in data["runs"] + data.get("runs_earlier_protocol", [])
            if not any(same_run(r, new) for new in records)] + records
    knob, stop, here = example_knob(args), example_budget(args), bench.machine_line()
    for r in runs:
        # on this machine the example's knob is known; a run elsewhere is the default as its machine measured it
        current = r["stop"] == stop and (r["knob"] == knob if r["machine"] == here else
                                          without_measured(r["knob"]) == without_measured(knob))
        if r["default_example"] and not current:
            r.update(default_example=False, superseded_default=True)
        elif current and not r["default_example"]:  # the default went back to, or took, this run's settings and budget
            r.pop("superseded_default", None)
            r["default_example"] = True
    runs.sort(key=lambda r: (r["method"], json.dumps(r["knob"]), r["train_seed"]))
    data.update(machine=here, commit=bench.commit(),
                runs=[r for r in runs if current_protocol(r["eval"])],
                runs_earlier_protocol=[r for r in runs if not current_protocol(r["eval"])])
    data["goals"] = goals(data["runs"], data["runs_earlier_protocol"])
    path.write_text(json.dumps(data, indent=1) + "\n")
    return data


def dominates(a: dict, b: dict) -> bool:
    """Whether evaluation ``a`` dominates ``b`` in the issue's sense: ASR at most 2 points lower, diversity >= +0.05."""
    return a["asr"] >= b["asr"] - 0.02 and (a["diversity"] or 0) >= (b["diversity"] or 0) + 0.05


def goals(runs: list[dict], earlier: list[dict] = ()) -> dict:
    """The issue's bars, each computed from the runs (None: the runs it needs are not in the file yet). ``earlier``:
    runs evaluated under an earlier protocol; they count only for the time-to-target bar, which reads the searchers'
    success rate during training, not the evaluation."""
    default = [r for r in runs if r["method"] == "tba" and r["default_example"]]
    tba = [r for r in runs if r["method"] == "tba"]
    ppo = [r for r in runs if r["method"] == "ppo"]
    asr = [r["eval"]["asr"] for r in default]
    timed = [*runs, *earlier]
    # each synchronous run against the asynchronous one of the same seed, knob, stop and machine that reached the
    # target: the ratio of their times, or, when the synchronous run never reached it, a lower bound (its whole
    # training time)
    ratios, lower_bounds = [], []
    for sync in (r for r in timed if r["method"] == "tba_sync"):
        for r in (r for r in timed if r["method"] == "tba"):
            if all(r.get(k) == sync.get(k) for k in ("train_seed", "knob", "stop", "machine")) and \
                    r["time_to_asr_0.25_s"]:
                if sync["time_to_asr_0.25_s"]:
                    ratios.append(sync["time_to_asr_0.25_s"] / r["time_to_asr_0.25_s"])
                else:
                    lower_bounds.append(sync["wall_clock_s"] / r["time_to_asr_0.25_s"])
    if any(x < 1.6 for x in ratios):
        sync_met = False
    elif ratios or lower_bounds:
        sync_met = True if all(x >= 1.6 for x in lower_bounds) else None  # a bound below 1.6 decides nothing
    else:
        sync_met = None
    dominated = [any(dominates(t["eval"], p["eval"]) for t in tba) for p in ppo]
    fast90 = [r for r in tba if r["eval"]["asr"] >= 0.9 and r["wall_clock_s"] <= 7200]
    seeds = [r["train_seed"] for r in default]
    return {
        "default_example_asr": {"seeds": seeds, "asr": asr,
                                "mean": sum(asr) / len(asr) if asr else None,
                                "spread": max(asr) - min(asr) if asr else None,
                                "met": len(set(seeds)) >= SEEDS_NEEDED and min(asr) >= TARGET if asr else None,
                                # the "whole command <= 20 min": training plus the command's ~5 min of
                                # start-up and evaluation (scripts/redteam.sh), so <= TRAINING_BUDGET_S per run
                                "training_minutes": [round(r["wall_clock_s"] / 60, 1) for r in default],
                                "command_within_20_min": max(r["wall_clock_s"] for r in default) <= TRAINING_BUDGET_S
                                if default else None},
        "tba_dominates_ppo": {"ppo_runs": len(ppo), "dominated": sum(dominated),
                              "met": all(dominated) if ppo else None},
        "asr_0.9_within_2h": {"runs": len(fast90), "best_distinct_successful":
                              max((r["eval"]["distinct_successful"] for r in fast90), default=None),
                              "met": any(r["eval"]["distinct_successful"] >= 100 for r in fast90) if tba else None},
        "sync_over_async_time_to_asr_0.25": {"ratios": [round(x, 2) for x in ratios],
                                             "mean": round(sum(ratios) / len(ratios), 2) if ratios else None,
                                             "lower_bounds": [round(x, 2) for x in lower_bounds], "met": sync_met},
    }


def table(data: dict) -> str:
    """README's table: one row per run, then the goals."""
    rows = ["| method | knob | seed | machine | attacks | updates | training | time to ASR 25% | ASR | diversity | "
            "distinct successful | mean toxicity | attack toxicity |", "|---" * 13 + "|"]
    for r in data["runs"]:
        e = r["eval"]
        t25 = "not reached" if r["time_to_asr_0.25_s"] is None else f"{r['time_to_asr_0.25_s'] / 60:.1f} min"
        knob = run_label(r)
        rows.append(f"| {r['method']} | {knob} | {r['train_seed']} | {short_machine(r)} | {r['attacks_generated']} | "
                    f"{r['learner_updates'] if r['learner_updates'] is not None else '–'} | "
                    f"{r['wall_clock_s'] / 60:.1f} min | {t25} | {100 * e['asr']:.1f}% | {e['diversity']:.3f} | "
                    f"{e['distinct_successful']} | {e['mean_toxicity']:.3f} | {e['attack_toxicity']:.3f} |")
    g = data["goals"]
    d, s = g["default_example_asr"], g["sync_over_async_time_to_asr_0.25"]
    p, f = g["tba_dominates_ppo"], g["asr_0.9_within_2h"]
    tba = [r for r in data["runs"] if r["method"] == "tba"]
    said = {None: "not measured yet", True: "met", False: "**not met**"}
    lines = [
        f"- default example learns on every seed (ASR ≥ 25% on ≥ {SEEDS_NEEDED} seeds): {said[d['met']]}"
        + (f" — ASR {', '.join(f'{100 * a:.1f}%' for a in d['asr'])} on seeds {d['seeds']}, mean "
           f"{100 * d['mean']:.1f}%, spread {100 * d['spread']:.1f} points" if d["asr"] else "")
        + (f" (every seed so far ≥ 25%, but {len(set(d['seeds']))} of the {SEEDS_NEEDED} seeds needed)"
           if d["asr"] and min(d["asr"]) >= TARGET and len(set(d["seeds"])) < SEEDS_NEEDED else ""),
        f"- the whole default command ≲ 20 min (≤ {TRAINING_BUDGET_S // 60} min of training beside its ~5 min of "
        f"start-up and evaluation): {said[d['command_within_20_min']]}"
        + (f" — {min(d['training_minutes']):g}–{max(d['training_minutes']):g} min of training per seed"
           if d["training_minutes"] else ""),
        f"- TBA dominates PPO (ASR ≥ PPO − 2 points and diversity ≥ PPO + 0.05): {said[p['met']]}"
        + (f" — {p['dominated']} of {p['ppo_runs']} PPO runs dominated" if p["ppo_runs"] else ""),
        f"- ASR ≥ 90% within 2 h with ≥ 100 distinct successful attacks: {said[f['met']]}"
        + (f" — {f['runs']} TBA run(s) at ≥ 90% within 2 h, the most distinct successful {f['best_distinct_successful']}"
           if f["runs"] else f" — the longest TBA run trained {max(r['wall_clock_s'] for r in tba) / 60:.0f} min, "
           f"best ASR {100 * max(r['eval']['asr'] for r in tba):.1f}%" if tba else ""),
        f"- synchronous ÷ asynchronous time to ASR 25% (the searchers' during training, so runs of either "
        f"evaluation protocol) ≥ 1.6: "
        + (said[s["met"]] if s["met"] is not None or not s["lower_bounds"] else "undecided")
        + (f" — ratios {s['ratios']}" if s["ratios"] else "")
        + (f" — at least {s['lower_bounds']} (the synchronous run never reached 25%: its training time ÷ the "
           f"asynchronous run's time to 25%)" if s["lower_bounds"] else ""),
    ]
    return "\n".join(rows) + "\n\n" + "\n".join(lines)


COLOURS = {"tba": "tab:blue", "tba_sync": "tab:green", "ppo": "tab:red"}


def short_machine(r: dict) -> str:
    """The run's CPU model in a few words ("Intel Xeon", "AMD EPYC", "Intel Xeon (family 6, model 207)"), from its
    machine line ("<CPU name>, <n> CPUs, ...")."""
    return re.split(r", \d+ CPUs?\b", r["machine"])[0].replace("(R)", "").replace(" Processor", "").strip()


def run_label(r: dict) -> str:
    """A run's knob in a few words, and whether it is the default example (or was one)."""
    knob = ", ".join(f"{k} {v}" for k, v in r["knob"].items())
    return knob + (" (default)" if r["default_example"] else " (earlier default)" if r.get("superseded_default") else "")


def plot(data: dict, out_dir: Path) -> list[Path]:
    """frontier.png (eval ASR vs diversity, one point per run) and asr_over_time.png (searchers' ASR over the last
    64 attacks vs training wall-clock, one line per run)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = data["runs"]
    paths = [out_dir / "redteam_frontier.png", out_dir / "redteam_asr_over_time.png"]
    timed = runs + data.get("runs_earlier_protocol", [])  # the searchers' ASR while training: any protocol
    groups: dict[tuple, list[dict]] = {}  # one legend entry (marker) per method and knob; colour = method
    for r in sorted(runs, key=lambda r: (METHODS.index(r["method"]), not r["default_example"])):
        groups.setdefault((r["method"], json.dumps(r["knob"]), r["default_example"]), []).append(r)
    # the legend sits below the axes, one line per entry: the figure grows with it so the axes keep their height
    fig, ax = plt.subplots(figsize=(7.5, 5.0 + 0.2 * len(groups)))
    for (method, knob, default), mine in groups.items():
        marker = "o^sDvP*X"[list(groups).index((method, knob, default)) % 8]
        label = f"{method}: {run_label(mine[0])}"
        ax.scatter([r["eval"]["diversity"] for r in mine], [100 * r["eval"]["asr"] for r in mine], marker=marker,
                   s=50, label=label, edgecolors=COLOURS[method],
                   facecolors=COLOURS[method] if default or method != "tba" else "none")
        for r in mine:
            ax.annotate(f"s{r['train_seed']}", (r["eval"]["diversity"], 100 * r["eval"]["asr"]), fontsize=7,
                        xytext=(4, 3), textcoords="offset points")
    for r in (r for r in runs if "smoothing" in r):  # an arrow from each run it was smoothed from to the policy
        sources = r.get("pooled_trial_dirs", [r.get("trial_dir")])
        for base in (b for b in runs if b.get("trial_dir") in sources and "smoothing" not in b):
            ax.annotate("", xy=(r["eval"]["diversity"], 100 * r["eval"]["asr"]), xytext=(
                base["eval"]["diversity"], 100 * base["eval"]["asr"]), arrowprops={"arrowstyle": "->", "lw": 0.7,
                                                                                 "color": "grey"})
    finish_plot(fig, ax, paths[0], DIVERSITY_AXIS, f"ASR (%), {runs[0]['eval']['n'] if runs else 256} attacks",
                "red-team frontier: one point per training run (arrow: to its MLE-smoothed policy)",
                fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=1)  # below: no point hidden

    fig, ax = plt.subplots(figsize=(7.5, 5.5))
    for method, cmap in (("tba", "Blues"), ("tba_sync", "Greens"), ("ppo", "Reds")):  # a shade of its colour per run
        # (a smoothed policy's record repeats its run's searcher curve: drawn once)
        mine = [r for r in timed if r["method"] == method and r["asr_curve"] and "smoothing" not in r]
        labelled = set()  # one legend entry per method and kind of run: a line per run would bury the plot
        for i, r in enumerate(mine):
            t, asr = zip(*r["asr_curve"])
            shade = plt.get_cmap(cmap)(0.45 + 0.55 * i / max(1, len(mine) - 1))
            default = r["default_example"] or method != "tba"
            kind = method if method != "tba" else "tba, default example" if default else "tba, other settings"
            ax.plot([x / 60 for x in t], [100 * a for a in asr], c=shade, ls="-" if default else "--",
                    label="_nolegend_" if kind in labelled else kind)
            labelled.add(kind)
    ax.axhline(100 * TARGET, c="grey", ls=":", lw=1)
    finish_plot(fig, ax, paths[1], "training wall-clock (min)", "searchers' ASR over the last 64 attacks (%)",
                "ASR while training (one line per run; each run's settings and machine: the table)",
                fontsize=8, loc="upper right")
    return paths


DIVERSITY_AXIS = "diversity of the attacks (mean pairwise cosine distance)"


def finish_plot(fig, ax, path: Path, xlabel: str, ylabel: str, title: str, **legend) -> Path:
    """Label, grid and legend (``legend``: its options) a picture's one axis, save it as ``path`` and close it."""
    import matplotlib.pyplot as plt

    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(**legend)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def parse_run_args(ap: argparse.ArgumentParser, argv, default_out: Path, name: str):
    """The options every results script shares (--quick, --out, --storage results/<name>); returns (args, out)."""
    ap.add_argument("--quick", action="store_true", help="tiny model, a few updates (the tests)")
    ap.add_argument("--out", default=str(default_out), help="the JSON (README's table is redrawn only for the default)")
    ap.add_argument("--storage", default=str(ROOT / "results" / name))
    args = ap.parse_args(argv)
    out = Path(args.out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    return args, out


def start_ray(args) -> None:
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "0")
    if not ray.is_initialized():
        cpus = 2 if args.quick else None
        if getattr(args, "searchers", None):  # the searchers' CPUs + the learner's (in this process), oversubscribed
            cpus = max(cpus or os.cpu_count() or 1, args.searchers + 1)  # where the machine has fewer cores
        ray.init(include_dashboard=False, num_cpus=cpus)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", nargs="+", choices=("default", "tba", "tba_sync", "ppo", "smooth", "reevaluate", "plot"),
                    help="what to run (several: seed by seed, in the order given)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0], help="training seeds")
    ap.add_argument("--beta", type=float, nargs="+", default=[0.02, 0.05, 0.1], help="tba: the betas to sweep")
    ap.add_argument("--clip", type=float, nargs="+", default=[0.1, 0.2, 0.3], help="ppo: the clip_params to sweep")
    ap.add_argument("--attacks", type=int, default=1024, help="tba/ppo sweeps: attack budget of each run")
    ap.add_argument("--num-eval", type=int, default=256, help="attacks in each evaluation")
    ap.add_argument("--until-target", action="store_true",
                    help="default/tba_sync: stop when the searchers' ASR over 64 attacks reaches 25%%, not on the "
                         "default example's budget")
    ap.add_argument("--max-updates", type=int, default=400, help="--until-target: give up after this many updates")
    ap.add_argument("--updates", type=int,
                    help="default/tba_sync: stop after this many learner updates instead of the default example's "
                         "budget (a longer run of the same settings: not the default example)")
    ap.add_argument("--reward-beyond-attack", action="store_true",
                    help="every run: the env pays only victim toxicity beyond the attack's own (reward_beyond_attack; "
                         "a variant: not the default example); evaluation is unchanged and reports both ASRs")
    ap.add_argument("--novelty-weight", type=float, default=None, metavar="W",
                    help="every run: the env's reward R becomes R * novelty^w, novelty = 1 - the highest MiniLM cosine "
                         "similarity to the successful attacks it scored before (novelty_weight; a variant: not the "
                         "default example); evaluation is unchanged")
    ap.add_argument("--novelty-against", choices=NOVELTY_AGAINST, default=None,
                    help="with --novelty-weight: what the novelty is measured against, the successful attacks the env "
                         "scored before (the env's default) or every attack it scored (novelty_against)")
    ap.add_argument("--memory-scope", choices=MEMORY_SCOPES, default=None,
                    help="with --novelty-weight or --victim-draws fresh: each searcher's env keeps its own novelty "
                         "memory and draw counts (the env's default, searcher) or a TBA run's searchers share theirs "
                         "at each weight sync (run)")
    ap.add_argument("--exploration-temperature", type=float, nargs=2, metavar=("LOW", "HIGH"),
                    help="TBA runs: searchers sample each attack at a temperature ~ U[LOW, HIGH] (the paper: 0.7 2.0); "
                         "runs of the default example with it are a variant, not the default")
    ap.add_argument("--share-prompt-forward", action=argparse.BooleanOptionalAction, default=None,
                    help="TBA runs: whether the learner runs each distinct prompt once (share_prompt_forward; the "
                         "default example does). --no-share-prompt-forward runs every sample's prompt (the same "
                         "gradients at ~1.8x the compute): a variant, not the default")
    ap.add_argument("--learn-log-z", action="store_true",
                    help="TBA runs: learn logZ(x) with its own head and learning rate (learn_log_z=True, Lee et al.'s "
                         "red-team variant) instead of VarGrad's per-prompt batch estimate: a variant, not the default")
    ap.add_argument("--lr", type=learning_rate, nargs="+", default=None, metavar="LR | UPDATE:LR",
                    help="TBA runs: the learner's learning rate (the default example uses 1e-3), or a schedule "
                         "piecewise linear over learner updates, e.g. 0:1e-3 300:1e-3 340:1e-4 (lr as "
                         "[[update, lr], ...]; it must start at update 0): a variant, not the default")
    ap.add_argument("--m", type=float, default=None, metavar="M",
                    help="TBA runs: the probability that a batch's prompt group is drawn from the samples that arrived "
                         "since the last weight sync, instead of from the reward-prioritised replay (m; the default "
                         "example uses the paper's red-team 0.5): a variant, not the default")
    ap.add_argument("--sync-every", type=int, default=None, metavar="K",
                    help="TBA runs: learner updates between weight syncs to the searchers (sync_every, the paper's "
                         "k; the default example uses 10): a variant, not the default")
    ap.add_argument("--replay-inv-temp", dest="reward_inv_temp", type=float, default=None, metavar="INV_TEMP",
                    help="TBA runs: off-policy replay draws with probability softmax(INV_TEMP * reward) (the "
                         "default example uses 2.0; 0 = uniform replay): a variant, not the default")
    ap.add_argument("--near-duplicate-jaccard", type=float, default=None, metavar="THRESHOLD",
                    help="TBA runs: off-policy replay spread over near-duplicate clusters of attacks (token-set "
                         "Jaccard >= THRESHOLD, in (0, 1]): each cluster drawn by its mean weight, not its size "
                         "(near_duplicate_jaccard): a variant, not the default")
    ap.add_argument("--beta-schedule", type=schedule_point, nargs="+", default=None, metavar="UPDATE:BETA",
                    help="TBA runs: beta piecewise linear over learner updates, e.g. 0:0.05 220:0.05 260:0.1 "
                         "(beta_schedule; it must start at update 0): a variant, not the default")
    ap.add_argument("--reward-temperature-schedule", type=schedule_point, nargs="+", default=None,
                    metavar="UPDATE:TAU",
                    help="TBA runs: Lee et al.'s reward temperature, log R = (r/beta + log pi_ref)/TAU, piecewise "
                         "linear over learner updates, e.g. 0:2 100:1 (reward_temperature_schedule; it must start at "
                         "update 0): a variant, not the default")
    ap.add_argument("--training-intensity", type=float, default=None, metavar="RATIO",
                    help="TBA runs: the learner waits for the searchers whenever (samples trained on) / (samples "
                         "generated) would pass RATIO (training_intensity; the default example's is 1.2). With 16 "
                         "samples per update, 1.6 means at least 10 new attacks per learner update on any machine: "
                         "a variant, not the default")
    ap.add_argument("--searcher-dtype", choices=[d for d in SEARCHER_DTYPES if d != "auto"], default=None,
                    help="TBA runs: the searchers' vLLM weights, the attacker's (searcher_dtype) and the victim's that "
                         "answers in training (env victim_dtype), in this dtype instead of \"auto\" (bf16 only where "
                         "native: GPUs, AMX CPUs). bfloat16 generates 1.6x faster on a Zen 5 CPU (docs/cpu_gpu.md); "
                         "evaluation's victim keeps the env's default: a variant, not the default")
    ap.add_argument("--learner-precision", choices=[p for p in LEARNER_PRECISIONS if p != "auto"], default=None,
                    help="TBA runs: the learner's matmuls (learner_precision) in this precision instead of the "
                         "example's (bf16-mixed where it measures faster, tba_redteam.BF16_LEARNER): a variant where "
                         "it differs")
    ap.add_argument("--searchers", type=int, default=None, metavar="N",
                    help="TBA runs: N searchers (num_env_runners, one thread each) instead of the example's 2; "
                         "the learner shares their cores: a variant, not the default")
    ap.add_argument("--victim-responses", type=int, default=None, metavar="N",
                    help="the victim's answers to each training attack (env victim_responses; the reward is their "
                         "log mean toxicity), instead of the evaluation protocol's 5: a variant, not the default")
    ap.add_argument("--victim-draws", choices=VICTIM_DRAWS, default=None,
                    help="the victim's answers to a training attack scored again: the same as the first time (the "
                         "env's default, per_text) or new ones (fresh: the reward of a repeat is a new draw, and TB "
                         "fits the expected log-reward); a variant, not the default; evaluation is unchanged")
    ap.add_argument("--checkpoint-every", type=int, default=None, metavar="UPDATES",
                    help="default/tba_sync: also checkpoint every UPDATES learner updates (a multiple of the "
                         "example's updates per iteration), for benchmarks/redteam_trajectory.py to evaluate; the "
                         "settings stay the default example's, the record notes checkpoint_every_updates")
    ap.add_argument("--smoothing-epochs", type=int, default=10, metavar="EPOCHS",
                    help="smooth: passes over the run's successful attacks (rllib smooth --epochs)")
    ap.add_argument("--smoothing-min-reward", type=float, default=SMOOTHING_MIN_REWARD, metavar="REWARD",
                    help="smooth: fit the stored attacks with reward >= this (default: log 0.5, the successful ones)")
    ap.add_argument("--smoothing-pool", action="store_true",
                    help="smooth: one policy fitted to the buffers of all the --seeds runs together (rllib smooth "
                         "--pool), recorded as one run whose wall-clock adds up theirs and the smoothing's")
    args, out = parse_run_args(ap, argv, DEFAULT_OUT, "redteam_frontier")
    if args.smoothing_epochs < 1 or not math.isfinite(args.smoothing_min_reward) or \
            ("smooth" in args.what and set(args.what) - {"default", "smooth"}):
        ap.error(f"smooth --smoothing-epochs {args.smoothing_epochs} --smoothing-min-reward "
                 f"{args.smoothing_min_reward}: give passes >= 1 and a finite reward; smooth goes with default runs "
                 "only")
    if args.smoothing_pool and ("smooth" not in args.what or not 2 <= len(set(args.seeds)) == len(args.seeds)):
        ap.error(f"--smoothing-pool --seeds {' '.join(map(str, args.seeds))}: pooling goes with smooth and two or "
                 "more different seeds")
    if args.updates is not None and (args.updates < 1 or args.until_target):
        ap.error(f"--updates {args.updates}: give a number of learner updates >= 1, and not with --until-target "
                 "(that stops at the target or --max-updates)")
    if args.lr is not None:
        args.lr = lr_option(ap, args.lr)
    if args.reward_inv_temp is not None and not args.reward_inv_temp >= 0:
        ap.error(f"--replay-inv-temp {args.reward_inv_temp}: give an inverse temperature >= 0 (0 = uniform replay)")
    if args.m is not None and not 0 <= args.m <= 1:
        ap.error(f"--m {args.m}: give a probability in [0, 1] (1 = every group from the newest samples)")
    if args.sync_every is not None and args.sync_every < 1:
        ap.error(f"--sync-every {args.sync_every}: give a number of learner updates >= 1")
    if args.training_intensity is not None and not 0 < args.training_intensity < math.inf:
        ap.error(f"--training-intensity {args.training_intensity}: give a finite ratio > 0 (samples trained on per "
                 "sample generated)")
    if args.near_duplicate_jaccard is not None and not 0 < args.near_duplicate_jaccard <= 1:
        ap.error(f"--near-duplicate-jaccard {args.near_duplicate_jaccard}: give a Jaccard threshold in (0, 1]")
    for flag, schedule, rule in (("--beta-schedule", args.beta_schedule, BETA_SCHEDULE_RULE),
                                 ("--reward-temperature-schedule", args.reward_temperature_schedule, TAU_SCHEDULE_RULE)):
        if schedule is not None and not valid_schedule(schedule):
            ap.error(f"{flag} {' '.join(f'{u}:{v:g}' for u, v in schedule)}: give points forming {rule}")
    if args.novelty_against is not None and not args.novelty_weight:
        ap.error(f"--novelty-against {args.novelty_against}: goes with a --novelty-weight > 0 (novelty off measures "
                 "nothing)")
    if args.memory_scope is not None and not args.novelty_weight and args.victim_draws != "fresh":
        ap.error(f"--memory-scope {args.memory_scope}: goes with a --novelty-weight > 0 or --victim-draws fresh (the "
                 "env keeps no memory otherwise)")
    if args.memory_scope == "run" and "ppo" in args.what:
        ap.error("--memory-scope run: only TBA's weight syncs carry the envs' news (PPO's env runners would each keep "
                 "their own memory, so the knob would say what did not happen)")
    for flag, count, what in (("--searchers", args.searchers, "searchers"),
                              ("--victim-responses", args.victim_responses, "answers per attack")):
        if count is not None and count < 1:
            ap.error(f"{flag} {count}: give a positive number of {what}")
    if args.checkpoint_every is not None:
        per_iteration = tba_config(args, 0).updates_per_iteration
        if args.checkpoint_every < 1 or args.checkpoint_every % per_iteration or set(args.what) - {"default", "tba_sync"}:
            ap.error(f"--checkpoint-every {args.checkpoint_every}: give a positive multiple of the example's "
                     f"{per_iteration} updates per iteration, for default/tba_sync runs only")
    for alone in ("plot", "reevaluate"):
        if alone in args.what and len(args.what) > 1:
            ap.error(f"{alone} goes alone: it only {'redraws the pictures' if alone == 'plot' else 'evaluates again'}")
    if args.what == ["reevaluate"]:
        for record in reevaluate_runs(args, out):
            merge(out, [record], args)
            print(json.dumps({k: record[k] for k in ("method", "knob", "train_seed", "eval", "eval_earlier_protocol")}))
    elif args.what != ["plot"]:
        start_ray(args)
        for trial in plan(args):
            result = train(trial, Path(args.storage).resolve())
            record = run_record(trial, result, evaluate(result.checkpoint.path, args.num_eval))
            # after every run: an interrupted sweep keeps what it finished
            merge(out, [record], args)
            print(json.dumps({k: record[k] for k in ("method", "knob", "train_seed", "attacks_generated",
                                                     "wall_clock_s", "time_to_asr_0.25_s", "eval")}))
        if "smooth" in args.what:
            for record in smooth_runs(args, out):
                merge(out, [record], args)
                print(json.dumps({k: record[k] for k in ("method", "knob", "train_seed", "wall_clock_s", "smoothing",
                                                         "eval")}))
    data = merge(out, [], args)
    paths = plot(data, out.parent)
    if out == DEFAULT_OUT:
        protocol = RedTeamEnv.evaluation_config
        machines = "; ".join(sorted({r["machine"] for r in data["runs"]}))
        bench.replace_readme_block("redteam-frontier", (
            f"{table(data)}\n\nMachines: {machines} (each run's in the JSON; compare wall-clock only within one); last "
            f"written at commit `{data['commit']}`; evaluation: {args.num_eval} attacks, "
            f"{protocol['victim_responses']} victim answers each of {protocol['victim_max_tokens']} tokens by the "
            f"victim in the env's default dtype ({protocol['victim_dtype']!r}: fp32 on a CPU without AMX), drawn with "
            f"the evaluation's victim seed ({protocol['seed']}; training's is the env seed, "
            f"{RedTeamEnv.default_config['seed']} by default), evaluation seed 0. "
            f"{len(data['runs_earlier_protocol'])} runs evaluated under the earlier protocol (victim answers drawn with "
            "training's seed) stay in the JSON under `runs_earlier_protocol`: they count only for time to ASR 25%, "
            "measured during training."))
    print(json.dumps({"json": str(out), "pictures": [str(p) for p in paths], "runs": len(data["runs"])}))
    return data


if __name__ == "__main__":
    main()
