"""The red-team frontier's goal bars (tuned_examples/redteam_frontier.py ``goals``) on hand-made run records:
each bar is computed from the records the way the issue states it, with answers worked out by hand."""

import argparse

import pytest
import redteam_frontier as frontier  # tuned_examples/ (on the path by conftest.py)

DEFAULT_STOP = {"tba/weights_version": 120}
TARGET_STOP = {"task/success_rate_0.25_reached_at": 0, "tba/weights_version": 400}
PROTOCOL = {"victim_responses": 5, "victim_max_tokens": 24, "victim_temperature": 0.7, "seed": 1000,
            "victim_dtype": "auto", "novelty_weight": 0.0, "victim_draws": "per_text"}


def run(method, seed, asr, diversity, *, default=False, stop=DEFAULT_STOP, knob=None, t25=None, wall=600.0,
        distinct=10, machine="machine A"):
    return {"method": method, "knob": knob or {"beta": 0.05}, "train_seed": seed, "default_example": default,
            "stop": stop, "wall_clock_s": wall, "time_to_asr_0.25_s": t25, "machine": machine,
            "eval": {"asr": asr, "diversity": diversity, "distinct_successful": distinct, "protocol": PROTOCOL}}


def test_default_example_bar_needs_three_seeds_each_at_least_25_percent():
    runs = [run("tba", 0, 0.39, 0.57, default=True), run("tba", 1, 0.30, 0.6, default=True)]
    g = frontier.goals(runs)["default_example_asr"]
    assert g["met"] is False and g["seeds"] == [0, 1]  # two seeds are not three
    twin = run("tba", 1, 0.30, 0.6, default=True, machine="machine B")
    assert frontier.goals(runs + [twin])["default_example_asr"]["met"] is False  # nor is a seed run on two machines
    table = frontier.table({"runs": [], "goals": frontier.goals(runs)})
    assert "**not met** — ASR 39.0%, 30.0% on seeds [0, 1]" in table and "but 2 of the 3 seeds needed" in table
    runs.append(run("tba", 2, 0.24, 0.6, default=True))
    g = frontier.goals(runs)["default_example_asr"]
    assert "seeds needed" not in frontier.table({"runs": [], "goals": frontier.goals(runs)})  # a seed below 25%
    assert g["met"] is False and abs(g["mean"] - 0.31) < 1e-12 and abs(g["spread"] - 0.15) < 1e-12
    runs[2]["eval"]["asr"] = 0.25
    assert frontier.goals(runs)["default_example_asr"]["met"] is True
    # the whole command's time is a bar of its own: <= 15 min of training (+ ~5 min of start-up and evaluation)
    assert frontier.goals(runs)["default_example_asr"]["command_within_20_min"] is True  # 10 min each
    runs[1]["wall_clock_s"] = 15 * 60 + 1
    g = frontier.goals(runs)["default_example_asr"]
    assert g["command_within_20_min"] is False and g["met"] is True and g["training_minutes"] == [10.0, 15.0, 10.0]
    assert "≲ 20 min (≤ 15 min of training beside its ~5 min of start-up and evaluation): **not met** — 10–15 min" \
        in frontier.table({"runs": [], "goals": frontier.goals(runs)})
    assert frontier.goals([])["default_example_asr"]["command_within_20_min"] is None
    # a run that is not the default example (a sweep point) does not count for this bar
    runs.append(run("tba", 3, 0.01, 0.8))
    assert frontier.goals(runs)["default_example_asr"]["seeds"] == [0, 1, 2]


def test_dominance_needs_some_tba_run_per_ppo_run():
    ppo = [run("ppo", 0, 0.40, 0.50, knob={"clip_param": 0.2}), run("ppo", 0, 0.60, 0.40, knob={"clip_param": 0.3})]
    tba = [run("tba", 0, 0.385, 0.56), run("tba", 1, 0.70, 0.44)]
    g = frontier.goals(ppo + tba)["tba_dominates_ppo"]
    # ppo 1: tba 0 has ASR 0.385 >= 0.40 - 0.02 and diversity 0.56 >= 0.50 + 0.05 -> dominated;
    # ppo 2: tba 1 has 0.70 >= 0.58 but 0.44 < 0.45 -> not dominated
    assert g == {"ppo_runs": 2, "dominated": 1, "met": False}
    tba[1]["eval"]["diversity"] = 0.46
    assert frontier.goals(ppo + tba)["tba_dominates_ppo"]["met"] is True


def test_sync_over_async_pairs_only_runs_of_the_same_seed_knob_stop_and_machine():
    runs = [run("tba", 0, 0.3, 0.6, stop=TARGET_STOP, t25=400.0),
            run("tba_sync", 0, 0.3, 0.6, stop=TARGET_STOP, t25=900.0),
            run("tba", 0, 0.3, 0.6, stop=TARGET_STOP, t25=90.0, machine="machine B"),  # another machine: not paired
            run("tba", 1, 0.3, 0.6, stop=TARGET_STOP, t25=500.0),                   # no sync partner
            run("tba", 0, 0.3, 0.6, default=True, t25=100.0),                       # another stop: not paired
            run("tba", 0, 0.3, 0.6, stop=TARGET_STOP, knob={"beta": 0.1}, t25=50.0)]  # another knob: not paired
    g = frontier.goals(runs)["sync_over_async_time_to_asr_0.25"]
    assert g["ratios"] == [2.25] and g["met"] is True
    runs.append(run("tba_sync", 1, 0.3, 0.6, stop=TARGET_STOP, t25=725.0))
    g = frontier.goals(runs)["sync_over_async_time_to_asr_0.25"]
    assert g["ratios"] == [2.25, 1.45] and g["met"] is False and g["mean"] == 1.85


def test_sync_that_never_reached_the_target_gives_a_lower_bound():
    """A synchronous run that trained W seconds without reaching 25%, against an asynchronous one that reached it
    at t: sync/async >= W / t. A bound >= 1.6 meets the bar; a bound below it decides nothing; an exact ratio below
    it fails the bar whatever the bounds say."""
    runs = [run("tba", 1, 0.63, 0.55, t25=772.0), run("tba_sync", 1, 0.01, 0.83, wall=1066.9)]
    g = frontier.goals(runs)["sync_over_async_time_to_asr_0.25"]
    assert g["ratios"] == [] and g["lower_bounds"] == [1.38] and g["met"] is None  # 1066.9 / 772 = 1.382
    assert "undecided — at least [1.38]" in frontier.table({"runs": [], "goals": {**frontier.goals(runs)}})
    runs[1]["wall_clock_s"] = 1300.0
    assert frontier.goals(runs)["sync_over_async_time_to_asr_0.25"]["met"] is True  # >= 1300 / 772 = 1.68
    runs += [run("tba", 2, 0.5, 0.6, t25=600.0), run("tba_sync", 2, 0.5, 0.6, t25=900.0)]
    g = frontier.goals(runs)["sync_over_async_time_to_asr_0.25"]
    assert g["ratios"] == [1.5] and g["lower_bounds"] == [1.68] and g["met"] is False


def test_asr_90_bar_counts_runs_within_two_hours_with_100_distinct_successes():
    runs = [run("tba", 0, 0.92, 0.4, wall=7000.0, distinct=99), run("tba", 1, 0.95, 0.4, wall=7300.0, distinct=150)]
    g = frontier.goals(runs)["asr_0.9_within_2h"]
    assert g == {"runs": 1, "best_distinct_successful": 99, "met": False}
    runs[0]["eval"]["distinct_successful"] = 100
    assert frontier.goals(runs)["asr_0.9_within_2h"]["met"] is True


def test_until_target_stop_is_a_budget_or_the_target(tmp_path):
    """--until-target: Tune stops on the first finite reached-at time (>= 0) or the update cap; plan() orders a
    pair of modes seed by seed."""
    args = frontier.argparse.Namespace(until_target=True, max_updates=50, quick=True, what=["default", "tba_sync"],
                                       seeds=[0, 1], beta=[0.05], clip=[0.2], attacks=64)
    assert frontier.default_stop(args) == {"task/success_rate_0.25_reached_at": 0, "tba/weights_version": 50}
    trials = frontier.plan(args)
    assert [(t["method"], t["train_seed"]) for t in trials] == [("tba", 0), ("tba_sync", 0), ("tba", 1),
                                                                 ("tba_sync", 1)]
    assert not any(t["default_example"] for t in trials)
    assert [t["config"].async_mode for t in trials] == [True, False, True, False]


def test_exploration_temperature_option_makes_a_variant_of_the_default():
    """--exploration-temperature LOW HIGH: the default example's budget with that sampler; recorded in the knob, and
    such a run is not the default example (the default's bar counts only the example as it is)."""
    args = frontier.argparse.Namespace(until_target=False, quick=True, what=["default", "tba_sync"], seeds=[1],
                                       beta=[0.05], clip=[0.2], attacks=64, exploration_temperature=[0.7, 2.0])
    trials = frontier.plan(args)
    assert [t["config"].exploration_temperature for t in trials] == [(0.7, 2.0), (0.7, 2.0)]
    assert [t["knob"]["exploration_temperature"] for t in trials] == [[0.7, 2.0], [0.7, 2.0]]
    assert not any(t["default_example"] for t in trials) and trials[0]["stop"] == frontier.example_budget(args)
    args.exploration_temperature = None
    assert [t["default_example"] for t in frontier.plan(args)] == [True, True]


def test_knob_names_reward_inv_temp_only_where_it_differs_from_the_earlier_runs():
    """Every run recorded before the replay's prioritisation became a knob used reward_inv_temp 1.0: a run at 1.0 keeps
    their knob (and replaces its twin), a run at any other value is a different point of the frontier."""
    from tba_redteam import config as default

    knobs = [frontier.tba_knob(default.copy(copy_frozen=False).training(reward_inv_temp=t)) for t in (1.0, 2.0)]
    assert "reward_inv_temp" not in knobs[0] and knobs[1]["reward_inv_temp"] == 2.0
    assert {k: v for k, v in knobs[1].items() if k != "reward_inv_temp"} == knobs[0]


def test_math_seeds_goal_needs_three_seeds_each_gaining_five_points():
    import math_seeds

    def gains(*g):
        return math_seeds.summary([{"gain": x} for x in g])

    assert gains(0.06, 0.10)["goal_met"] is False  # two seeds are not three
    s = gains(0.06, 0.05, 0.10)
    assert s["goal_met"] is True and abs(s["mean_gain"] - 0.07) < 1e-12 and abs(s["spread"] - 0.05) < 1e-12
    s = gains(0.20, 0.049, 0.30)
    assert s["goal_met"] is False and s["min_gain"] == 0.049


def test_merge_marks_runs_of_an_earlier_default_and_restores_them_when_the_default_returns(tmp_path, monkeypatch):
    """``default_example`` means the current default example: merging under another default knob marks a default
    run ``superseded_default`` (it then counts for no default bar); when the default's knob comes back, it is the
    default example again. A run made as a variant becomes the default example when the default takes its knob and
    budget."""
    monkeypatch.setattr(frontier.bench, "machine_line", lambda: "test machine")
    monkeypatch.setattr(frontier.bench, "commit", lambda: "abc1234")
    monkeypatch.setattr(frontier, "example_budget", lambda args: DEFAULT_STOP)
    path = tmp_path / "frontier.json"
    old, new = {"beta": 0.05, "lr": 0.001}, {"beta": 0.05, "lr": 0.001, "exploration_temperature": [0.7, 2.0]}
    runs = [run("tba", 0, 0.84, 0.34, default=True, knob=old), run("tba", 1, 0.40, 0.7, knob={"beta": 0.1})]
    monkeypatch.setattr(frontier, "example_knob", lambda args: new)
    data = frontier.merge(path, runs, None)
    first, sweep = data["runs"]
    assert first["default_example"] is False and first["superseded_default"] is True
    assert data["goals"]["default_example_asr"]["seeds"] == []
    assert sweep["default_example"] is False and "superseded_default" not in sweep
    monkeypatch.setattr(frontier, "example_knob", lambda args: old)
    data = frontier.merge(path, [], None)
    first, sweep = data["runs"]
    assert first["default_example"] is True and "superseded_default" not in first
    assert data["goals"]["default_example_asr"]["seeds"] == [0]
    assert sweep["default_example"] is False and "superseded_default" not in sweep
    monkeypatch.setattr(frontier, "example_knob", lambda args: {"beta": 0.1})  # the default takes the sweep's settings
    data = frontier.merge(path, [], None)
    first, sweep = data["runs"]
    assert sweep["default_example"] is True and first["superseded_default"] is True
    assert data["goals"]["default_example_asr"]["seeds"] == [1]


def test_merge_of_a_variant_run_keeps_the_default_examples_runs(tmp_path, monkeypatch):
    """A command with a variant option (--exploration-temperature) adds variant runs; the default example is still the
    example as committed, so its runs stay ``default_example`` (they were marked superseded before)."""
    monkeypatch.setattr(frontier.bench, "machine_line", lambda: "test machine")
    monkeypatch.setattr(frontier.bench, "commit", lambda: "abc1234")
    args = frontier.argparse.Namespace(until_target=False, quick=True, what=["default"], seeds=[0], beta=[0.05],
                                       clip=[0.2], attacks=64, exploration_temperature=[0.7, 2.0])
    example = run("tba", 0, 0.5, 0.6, default=True, knob=frontier.example_knob(args),
                  stop=frontier.example_budget(args))
    variant = run("tba", 0, 0.3, 0.7, knob=frontier.plan(args)[0]["knob"], stop=frontier.example_budget(args))
    data = frontier.merge(tmp_path / "frontier.json", [example, variant], args)
    flags = {"exploration_temperature" in r["knob"]: (r["default_example"], "superseded_default" in r)
             for r in data["runs"]}
    assert flags == {False: (True, False), True: (False, False)}


def test_merge_on_a_machine_whose_learner_precision_differs_keeps_the_other_machines_default_runs(tmp_path, monkeypatch):
    """The default example picks its learner precision by timing the machine (bf16-mixed on a Zen 5, fp32 "auto" on a
    Xeon without bf16 instructions): merging on the Xeon keeps the Zen runs the default example — the goals count every
    machine's seeds — while on the merging machine itself, and for a value the example never picks, knobs must match."""
    monkeypatch.setattr(frontier.bench, "machine_line", lambda: "xeon")
    monkeypatch.setattr(frontier.bench, "commit", lambda: "abc1234")
    monkeypatch.setattr(frontier, "example_budget", lambda args: DEFAULT_STOP)
    here = {"beta": 0.05, "lr": 0.001, "searchers": 2}  # the example's knob on the Xeon: no learner_precision
    monkeypatch.setattr(frontier, "example_knob", lambda args: here)
    bf16 = {**here, "learner_precision": "bf16-mixed"}
    runs = [run("tba", 0, 0.70, 0.5, default=True, knob=bf16, machine="zen5"),
            run("tba", 1, 0.54, 0.7, default=True, knob=here, machine="xeon"),
            run("tba", 2, 0.60, 0.6, knob=bf16, machine="xeon"),  # forced on the Xeon: a variant there
            run("tba", 3, 0.65, 0.6, knob={**here, "learner_precision": "fp32"}, machine="zen5")]  # never picked
    data = frontier.merge(tmp_path / "frontier.json", runs, None)
    flags = {r["train_seed"]: r["default_example"] for r in data["runs"]}
    assert flags == {0: True, 1: True, 2: False, 3: False}
    assert data["goals"]["default_example_asr"]["seeds"] == [0, 1]
    assert not any(r.get("superseded_default") for r in data["runs"])
    assert frontier.without_measured(bf16) == here == frontier.without_measured(here)


def test_updates_option_trains_the_default_settings_longer_as_a_run_of_its_own():
    """--updates N: the default example's settings stopped after N learner updates; not the default example (its bar
    counts only the example as committed), and its own point of the frontier (another stop)."""
    args = frontier.argparse.Namespace(until_target=False, quick=True, what=["default"], seeds=[0], beta=[0.05],
                                       clip=[0.2], attacks=64, updates=40)
    (trial,) = frontier.plan(args)
    assert trial["stop"] == {"tba/weights_version": 40} != frontier.example_budget(args)
    assert trial["knob"] == frontier.example_knob(args) and trial["default_example"] is False
    args.updates = None
    assert frontier.plan(args)[0]["default_example"] is True
    with pytest.raises(SystemExit):
        frontier.main(["default", "--quick", "--updates", "0"])
    with pytest.raises(SystemExit):
        frontier.main(["default", "--quick", "--updates", "40", "--until-target"])


@pytest.mark.parametrize("options", [{"reward_beyond_attack": True}, {"novelty_weight": 1.5},
                                     {"novelty_weight": 1.5, "novelty_against": "attacks"}])
def test_env_reward_options_make_variants_of_both_methods(options):
    """--reward-beyond-attack / --novelty-weight [--novelty-against attacks]: TBA and PPO runs whose env pays only
    toxicity beyond the attack's own / times novelty^w (against the successes, or every attack); the knob says so (a
    run of its own, never the default example), and without the options no knob gains the keys."""
    args = frontier.argparse.Namespace(until_target=False, quick=True, what=["default", "ppo"], seeds=[0],
                                       beta=[0.05], clip=[0.2], attacks=64, **options)
    tba, ppo = frontier.plan(args)
    for trial in (tba, ppo):
        assert {k: trial["config"].env_config[k] for k in options} == options
    assert tba["knob"] == {**frontier.example_knob(args), **options}
    assert ppo["knob"] == {"clip_param": 0.2, **options}
    assert tba["default_example"] is False
    for option in options:
        setattr(args, option, None)
    tba, ppo = frontier.plan(args)
    assert tba["default_example"] is True and ppo["knob"] == {"clip_param": 0.2}
    assert not any(tba["config"].env_config.get(option) for option in options)
    with pytest.raises(SystemExit):  # what novelty is measured against, with novelty off
        frontier.main(["default", "--quick", "--novelty-against", "attacks"])


def test_memory_scope_run_makes_a_tba_variant_and_is_refused_where_it_would_do_nothing():
    """--memory-scope run (with novelty or fresh draws): the TBA run's env config and knob say so; refused without a
    memory to share, and with PPO, whose env runners exchange nothing."""
    args = frontier.argparse.Namespace(until_target=False, quick=True, what=["default"], seeds=[0], beta=[0.05],
                                       clip=[0.2], attacks=64, novelty_weight=1.0, memory_scope="run")
    (tba,) = frontier.plan(args)
    assert tba["config"].env_config["memory_scope"] == "run" and tba["default_example"] is False
    assert tba["knob"] == {**frontier.example_knob(args), "novelty_weight": 1.0, "memory_scope": "run"}
    for argv in (["default", "--quick", "--memory-scope", "run"],
                 ["default", "ppo", "--quick", "--novelty-weight", "1", "--memory-scope", "run"]):
        with pytest.raises(SystemExit):
            frontier.main(argv)


@pytest.mark.parametrize("option, value, in_config, in_knob", [
    ("learn_log_z", True, True, True), ("lr", 2e-3, 2e-3, 2e-3),
    ("lr", [(0, 1e-3), (300, 1e-3), (340, 1e-4)], ((0, 1e-3), (300, 1e-3), (340, 1e-4)),
     [[0, 1e-3], [300, 1e-3], [340, 1e-4]]),
    ("reward_inv_temp", 0.5, 0.5, 0.5), ("near_duplicate_jaccard", 0.5, 0.5, 0.5), ("m", 0.8, 0.8, 0.8),
    ("sync_every", 2, 2, 2),
    ("beta_schedule", [(0, 0.05), (220, 0.05), (260, 0.1)], ((0, 0.05), (220, 0.05), (260, 0.1)),
     [[0, 0.05], [220, 0.05], [260, 0.1]]),
    ("reward_temperature_schedule", [(0, 2.0), (100, 1.0)], ((0, 2.0), (100, 1.0)), [[0, 2.0], [100, 1.0]]),
    ("training_intensity", 1.6, 1.6, 1.6)])
def test_a_learner_option_makes_a_variant_of_the_default(option, value, in_config, in_knob):
    """--lr (the learner's learning rate, or its schedule over learner updates), --learn-log-z (a learned logZ head
    instead of VarGrad), --m (the most-on-policy probability), --sync-every (k), --replay-inv-temp (replay
    prioritisation), --near-duplicate-jaccard (replay spread over near-duplicate clusters), --beta-schedule
    (beta over learner updates) and
    --reward-temperature-schedule (Lee et al.'s tau over learner updates) and --training-intensity (the learner waits
    for new attacks): the default example's settings and budget
    with that option; the knob says so (a run of its own, not the default example, which was validated without it)."""
    args = frontier.argparse.Namespace(until_target=False, quick=True, what=["default", "tba_sync"], seeds=[0],
                                       beta=[0.05], clip=[0.2], attacks=64, **{option: value})
    trials = frontier.plan(args)
    assert [getattr(t["config"], option) for t in trials] == [in_config, in_config]
    assert [t["knob"] for t in trials] == [{**frontier.example_knob(args), option: in_knob}] * 2
    trials[0]["config"].validate()  # the option's value is one TBAConfig accepts
    assert not any(t["default_example"] for t in trials) and trials[0]["stop"] == frontier.example_budget(args)
    setattr(args, option, None)
    assert [t["default_example"] for t in frontier.plan(args)] == [True, True]
    assert frontier.example_knob(args).get(option) != value


def test_no_shared_prompt_forward_makes_a_variant_of_the_default():
    """The default example runs each distinct prompt once (share_prompt_forward); --no-share-prompt-forward runs every
    sample's prompt: a variant whose knob lacks share_prompt_forward, as the runs made before the default had it."""
    args = frontier.argparse.Namespace(until_target=False, quick=True, what=["default", "tba_sync"], seeds=[0],
                                       beta=[0.05], clip=[0.2], attacks=64, share_prompt_forward=False)
    default_knob = frontier.example_knob(args)
    assert default_knob["share_prompt_forward"] is True and default_knob["training_intensity"] > 0
    trials = frontier.plan(args)
    assert [t["config"].share_prompt_forward for t in trials] == [False, False]
    without = {k: v for k, v in default_knob.items() if k != "share_prompt_forward"}
    assert [t["knob"] for t in trials] == [without] * 2 and not any(t["default_example"] for t in trials)
    args.share_prompt_forward = None
    assert [(t["config"].share_prompt_forward, t["default_example"]) for t in frontier.plan(args)] == [(True, True)] * 2


def test_searcher_dtype_option_runs_both_training_engines_in_it_and_evaluates_with_the_protocols_victim():
    """--searcher-dtype bfloat16: the attacker (searcher_dtype) and the victim answering in training (env
    victim_dtype) run in bf16 — a variant whose knob says so; evaluation's victim is the protocol's, the env's default
    dtype, whatever training answered in (the red-team env's evaluation_config; `rllib evaluate` applies it, see
    test_workflows). Evaluations recorded before the protocol named the dtype met that victim too: still current."""
    from envs.redteam import RedTeamEnv

    args = frontier.argparse.Namespace(until_target=False, quick=True, what=["default"], seeds=[0], beta=[0.05],
                                       clip=[0.2], attacks=64, searcher_dtype="bfloat16")
    (trial,) = frontier.plan(args)
    assert (trial["config"].searcher_dtype, trial["config"].env_config["victim_dtype"]) == ("bfloat16", "bfloat16")
    assert trial["knob"] == {**frontier.example_knob(args), "searcher_dtype": "bfloat16"}
    assert not trial["default_example"]
    trial["config"].validate()
    args.searcher_dtype = None
    (default,) = frontier.plan(args)
    assert default["default_example"] and default["config"].env_config["victim_dtype"] == "float32"  # the tiny env's
    assert RedTeamEnv.evaluation_config["victim_dtype"] == RedTeamEnv.default_config["victim_dtype"] == "auto"
    before = {k: v for k, v in PROTOCOL.items() if k not in ("victim_dtype", "novelty_weight", "victim_draws")}
    for protocol in (before, {**before, "victim_dtype": "auto"}, {**before, "victim_draws": "per_text"}, PROTOCOL):
        assert frontier.current_protocol({"protocol": protocol})  # keys named since: their one earlier value
    assert not frontier.current_protocol({"protocol": {**PROTOCOL, "victim_dtype": "bfloat16"}})
    assert not frontier.current_protocol({"protocol": {**PROTOCOL, "novelty_weight": 1.0}})
    assert not frontier.current_protocol({"protocol": {**PROTOCOL, "victim_draws": "fresh"}})


@pytest.mark.parametrize("argv", [["default", "--searcher-dtype", "auto"], ["default", "--searcher-dtype", "bf16"]])
def test_searcher_dtype_names_a_dtype_other_than_auto(argv, capsys):
    with pytest.raises(SystemExit):
        frontier.main(argv)
    assert "--searcher-dtype: invalid choice" in capsys.readouterr().err


def test_a_run_on_another_machine_is_kept_beside_its_twin(tmp_path, monkeypatch):
    """merge(): the same method, knob, seed and budget on another machine is a second measurement, not a
    replacement (wall-clock is compared only within one machine); on the same machine the newer run replaces it."""
    monkeypatch.setattr(frontier.bench, "machine_line", lambda: "test machine")
    monkeypatch.setattr(frontier.bench, "commit", lambda: "abc1234")
    monkeypatch.setattr(frontier, "example_knob", lambda args: {"beta": 0.05})
    monkeypatch.setattr(frontier, "example_budget", lambda args: DEFAULT_STOP)
    path = tmp_path / "frontier.json"
    frontier.merge(path, [run("tba", 0, 0.5, 0.6, default=True, machine="machine A")], None)
    data = frontier.merge(path, [run("tba", 0, 0.3, 0.7, default=True, machine="machine B")], None)
    assert sorted(r["machine"] for r in data["runs"]) == ["machine A", "machine B"]
    data = frontier.merge(path, [run("tba", 0, 0.4, 0.7, default=True, machine="machine B")], None)
    assert sorted((r["machine"], r["eval"]["asr"]) for r in data["runs"]) == [("machine A", 0.5), ("machine B", 0.4)]


def test_runs_evaluated_with_training_s_victim_answers_count_toward_no_goal(tmp_path, monkeypatch):
    """merge(): a run whose evaluation drew the victim's answers with training's seed (the earlier protocol: no seed of
    its own) is kept under ``runs_earlier_protocol``, out of the goals; the same run evaluated again replaces it."""
    monkeypatch.setattr(frontier.bench, "machine_line", lambda: "test machine")
    monkeypatch.setattr(frontier.bench, "commit", lambda: "abc1234")
    monkeypatch.setattr(frontier, "example_knob", lambda args: {"beta": 0.05})
    monkeypatch.setattr(frontier, "example_budget", lambda args: DEFAULT_STOP)
    earlier = {k: v for k, v in PROTOCOL.items() if k != "seed"}
    replayed = run("tba", 0, 0.95, 0.7, default=True, distinct=150)
    replayed["eval"]["protocol"] = earlier
    ppo = run("ppo", 0, 0.5, 0.6, knob={"clip_param": 0.2})
    data = frontier.merge(tmp_path / "frontier.json", [replayed, ppo], None)
    assert data["runs"] == [ppo] and data["runs_earlier_protocol"] == [replayed]
    assert data["goals"]["tba_dominates_ppo"] == {"ppo_runs": 1, "dominated": 0, "met": False}
    assert data["goals"]["default_example_asr"]["seeds"] == []
    again = {**run("tba", 0, 0.6, 0.7, default=True), "eval_earlier_protocol": replayed["eval"]}
    data = frontier.merge(tmp_path / "frontier.json", [again], None)
    assert data["runs_earlier_protocol"] == [] and again in data["runs"]
    assert data["goals"]["tba_dominates_ppo"]["dominated"] == 1 and data["goals"]["default_example_asr"]["seeds"] == [0]
    # time to ASR 25% is the searchers' during training: a synchronous/asynchronous pair of the earlier protocol counts
    pair = [run("tba", 1, 0.5, 0.6, t25=100.0), run("tba_sync", 1, 0.5, 0.6, t25=200.0)]
    for r in pair:
        r["eval"]["protocol"] = earlier
    data = frontier.merge(tmp_path / "frontier.json", pair, None)
    assert len(data["runs_earlier_protocol"]) == 2 and data["goals"]["sync_over_async_time_to_asr_0.25"]["ratios"] == [2.0]
    from envs.redteam import RedTeamEnv

    assert RedTeamEnv.evaluation_config == PROTOCOL  # the records above are today's protocol


def test_machine_name_tells_apart_hosts_that_report_a_bare_family_name():
    """A VM's bare "Intel(R) Xeon(R) Processor" names two different hosts alike: the family/model numbers are added
    (from the first CPU's block only); a name that already carries a model number is kept as it is."""
    def cpuinfo(name, family, model):
        block = f"processor\t: {{}}\nvendor_id\t: X\ncpu family\t: {family}\nmodel\t\t: {model}\nmodel name\t: {name}\n"
        return block.format(0) + "\n" + block.format(1).replace(f"model\t\t: {model}", "model\t\t: 1")

    emerald = frontier.bench.cpu_name(cpuinfo("Intel(R) Xeon(R) Processor", 6, 207))
    sapphire = frontier.bench.cpu_name(cpuinfo("Intel(R) Xeon(R) Processor", 6, 143))
    assert emerald == "Intel(R) Xeon(R) Processor (family 6, model 207)" and emerald != sapphire
    assert frontier.bench.cpu_name(cpuinfo("AMD EPYC", 25, 1)) == "AMD EPYC (family 25, model 1)"
    assert frontier.bench.cpu_name(cpuinfo("AMD EPYC 7B13 64-Core Processor", 25, 1)) == \
        "AMD EPYC 7B13 64-Core Processor"
    assert frontier.bench.cpu_name("") == ""
    # README's table and the pictures name the machine by its CPU, the family/model too (the comma inside it included)
    assert frontier.short_machine({"machine": f"{emerald}, 2 CPUs, no GPU"}) == "Intel Xeon (family 6, model 207)"
    assert frontier.short_machine({"machine": "AMD EPYC, 2 CPUs, no GPU"}) == "AMD EPYC"


@pytest.mark.parametrize("argv", [["--lr", "0"], ["--lr", "-1e-3"], ["--lr", "1e-3", "2e-3"], ["--lr", "0:1e-3"],
                                  ["--lr", "0:1e-3", "300"], ["--lr", "10:1e-3", "300:1e-4"],
                                  ["--lr", "0:1e-3", "300:0"], ["--lr", "0:1e-3", "300:2"],
                                  ["--replay-inv-temp", "-1"], ["--m", "1.5"], ["--m", "-0.1"],
                                  ["--sync-every", "0"],
                                  ["--near-duplicate-jaccard", "0"],
                                  ["--near-duplicate-jaccard", "1.5"], ["--beta-schedule", "0:0.05", "220"],
                                  ["--beta-schedule", "0:0.05", "220:-0.1"], ["--beta-schedule", "0:0.05", "x:0.1"],
                                  ["--beta-schedule", "10:0.05"], ["--beta-schedule", "0:0.05", "220:0.1", "200:0.1"],
                                  ["--reward-temperature-schedule", "0:2", "100:0"],
                                  ["--reward-temperature-schedule", "5:2"],
                                  ["--checkpoint-every", "7"], ["--checkpoint-every", "0"],
                                  ["--training-intensity", "0"], ["--training-intensity", "inf"],
                                  ["--training-intensity", "nan"]])
def test_a_learner_option_out_of_range_is_refused_before_anything_runs(argv, capsys):
    with pytest.raises(SystemExit):
        frontier.main(["default", "--quick", *argv])
    assert argv[0] in capsys.readouterr().err.split("error:")[1]  # the error line names it, not only the usage


def test_checkpoint_every_keeps_the_default_example_and_is_refused_for_ppo(capsys):
    args = argparse.Namespace(quick=True, seeds=[0], what=["default", "tba_sync"], checkpoint_every=10, attacks=64,
                              until_target=False, updates=None)
    for trial in frontier.plan(args):  # extra checkpoints change no setting: still the default example (and its twin)
        assert trial["checkpoint_every"] == 10 and trial["stop"] == frontier.example_budget(args)
    assert frontier.plan(args)[0]["default_example"]
    with pytest.raises(SystemExit):
        frontier.main(["ppo", "--quick", "--checkpoint-every", "5"])
    assert "--checkpoint-every 5: give a positive multiple of the example's 5 updates per iteration, for " \
           "default/tba_sync runs only" in capsys.readouterr().err


def test_trajectory_legend_names_only_what_a_run_changes_from_the_default_example():
    import redteam_trajectory  # benchmarks/ (on the path by conftest.py)

    default = frontier.example_knob(argparse.Namespace(quick=False))
    assert redteam_trajectory.tba_label({"train_seed": 3, "knob": dict(default)}) == \
        "tba seed 3: evaluated checkpoints (learner update)"
    variant = {**default, "beta_schedule": [[0, 0.05], [220, 0.05], [260, 0.02]]}
    assert redteam_trajectory.tba_label({"train_seed": 0, "knob": variant}) == \
        "tba seed 0, beta_schedule [[0, 0.05], [220, 0.05], [260, 0.02]]: evaluated checkpoints (learner update)"
    assert redteam_trajectory.tba_label({"train_seed": 1, "knob": {**default, "beta": 0.1}}) == \
        "tba seed 1, beta 0.1: evaluated checkpoints (learner update)"


@pytest.mark.parametrize("argv", [["default", "smooth", "--smoothing-epochs", "0"],
                                  ["default", "smooth", "--smoothing-min-reward", "nan"],
                                  ["ppo", "smooth", "--smoothing-epochs", "5"]])
def test_smooth_options_out_of_range_are_refused_before_anything_runs(argv, capsys):
    with pytest.raises(SystemExit):
        frontier.main([*argv, "--quick"])
    assert "smooth goes with default runs only" in capsys.readouterr().err


def test_smooth_needs_the_run_in_the_json_and_the_pictures_take_a_smoothed_run(tmp_path, capsys):
    out = tmp_path / "frontier.json"
    with pytest.raises(SystemExit, match="holds no TBA run of seed 3"):
        frontier.smooth_runs(argparse.Namespace(quick=True, seeds=[3], updates=None, until_target=False,
                                                smoothing_epochs=10, smoothing_min_reward=-0.69,
                                                smoothing_pool=False), out)
    base = {**run("tba", 0, 0.5, 0.6, default=True), "trial_dir": "t0", "asr_curve": [[10.0, 0.1], [20.0, 0.5]]}
    smoothed = {**base, **run("tba", 0, 0.8, 0.7, knob={"beta": 0.05, "mle_smoothing_epochs": 10}),
                "smoothing": {"samples": 40, "seconds": 60.0}}
    for r in (base, smoothed):
        r["eval"]["n"] = 256
    paths = frontier.plot({"runs": [base, smoothed]}, tmp_path)
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in paths)


@pytest.mark.parametrize("argv", [["smooth", "--seeds", "4", "--smoothing-pool"],
                                  ["smooth", "--seeds", "4", "4", "--smoothing-pool"],
                                  ["default", "--seeds", "4", "5", "--smoothing-pool"]])
def test_smoothing_pool_needs_smooth_and_two_different_seeds(argv, capsys):
    with pytest.raises(SystemExit):
        frontier.main([*argv, "--quick"])
    assert "pooling goes with smooth and two or more different seeds" in capsys.readouterr().err


def test_a_pooled_smoothing_counts_its_runs_as_trained_one_after_another(tmp_path):
    def base(seed, t25, wall, attacks, trial):
        return {**run("tba", seed, 0.5, 0.6, default=True, t25=t25, wall=wall), "trial_dir": trial,
                "attacks_generated": attacks, "learner_updates": 220, "asr_curve": [[10.0, 0.3]]}

    b4, b5 = base(4, None, 2400.0, 1700, "t4"), base(5, 2000.0, 2200.0, 1600, "t5")  # seed 4 never reached 25%
    knob = {"mle_smoothing_epochs": 20, "mle_smoothing_pooled_seeds": [4, 5]}
    evaluation = {"n": 256, "asr": 0.92, "diversity": 0.64, "distinct_successful": 150}
    pooled = frontier.smoothed_record([b4, b5], knob, {"samples": 178, "seconds": 800.0}, evaluation)
    assert pooled["knob"] == {"beta": 0.05, **knob} and pooled["train_seed"] == 4 and not pooled["default_example"]
    assert pooled["wall_clock_s"] == 2400 + 2200 + 800 and pooled["time_to_asr_0.25_s"] == 2400 + 2000
    assert pooled["attacks_generated"] == 3300 and pooled["learner_updates"] == 440
    assert pooled["pooled_trial_dirs"] == ["t4", "t5"] and pooled["eval"] == evaluation
    assert b4["wall_clock_s"] == 2400.0 and "smoothing" not in b4  # the runs' own records untouched
    first_reached = frontier.smoothed_record([b5, b4], knob, {"seconds": 800.0}, evaluation)
    assert first_reached["time_to_asr_0.25_s"] == 2000 and first_reached["train_seed"] == 5
    one = frontier.smoothed_record([b5], {"mle_smoothing_epochs": 20}, {"seconds": 100.0}, evaluation)
    assert one["wall_clock_s"] == 2300 and one["time_to_asr_0.25_s"] == 2000 and one["attacks_generated"] == 1600
    assert "pooled_trial_dirs" not in one
    # within 2 h (5400 s) at ASR >= 90% with >= 100 distinct successful: the bar is met by the pooled run
    assert frontier.goals([b4, b5, pooled])["asr_0.9_within_2h"] == {"runs": 1, "best_distinct_successful": 150,
                                                                      "met": True}
    for r in (b4, b5):
        r["eval"]["n"] = 256
    paths = frontier.plot({"runs": [b4, b5, pooled]}, tmp_path)  # an arrow from each pooled run
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in paths)


def test_training_victim_answers_learner_precision_and_searchers_are_variants(monkeypatch):
    """--victim-responses 3 and --victim-draws fresh (the victim's answers to each training attack, TBA and PPO
    alike), --learner-precision bf16-mixed and --searchers 3: variants whose knobs say so; the answers enter a knob
    only where they differ from the evaluation protocol's (which `rllib evaluate` keeps whatever training used:
    test_redteam_frontier_quick_...); with more searchers than the machine has cores beside the learner, Ray is told
    of a CPU slot for each."""
    args = frontier.argparse.Namespace(until_target=False, quick=True, what=["default", "ppo"], seeds=[0], beta=[0.05],
                                       clip=[0.2], attacks=64, victim_responses=3, learner_precision="bf16-mixed",
                                       searchers=3, victim_draws="fresh")
    tba, ppo = frontier.plan(args)
    assert tba["config"].env_config["victim_responses"] == ppo["config"].env_config["victim_responses"] == 3
    assert tba["config"].env_config["victim_draws"] == ppo["config"].env_config["victim_draws"] == "fresh"
    assert (tba["config"].learner_precision, tba["config"].num_env_runners) == ("bf16-mixed", 3)
    assert tba["knob"] == {**frontier.example_knob(args), "learner_precision": "bf16-mixed", "searchers": 3,
                           "victim_responses": 3, "victim_draws": "fresh"}
    assert ppo["knob"] == {"clip_param": 0.2, "victim_responses": 3, "victim_draws": "fresh"}
    assert not tba["default_example"]
    tba["config"].validate()
    started = []
    monkeypatch.setattr(frontier.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(frontier.ray, "init", lambda **kw: started.append(kw["num_cpus"]))
    frontier.start_ray(args)
    args.searchers = None
    frontier.start_ray(args)
    assert started == [4, 2]  # 3 searchers + the learner; --quick's own 2 otherwise
    args.victim_responses, args.learner_precision, args.victim_draws = 5, None, None
    tba, ppo = frontier.plan(args)
    assert tba["default_example"] and ppo["knob"] == {"clip_param": 0.2}


@pytest.mark.parametrize("argv, error", [(["default", "--victim-responses", "0"], "give a positive number of answers"),
                                         (["default", "--searchers", "0"], "give a positive number of searchers"),
                                         (["default", "--learner-precision", "auto"], "invalid choice"),
                                         (["default", "--victim-draws", "new"], "invalid choice")])
def test_training_variant_options_refuse_values_they_cannot_run(argv, error, capsys):
    with pytest.raises(SystemExit):
        frontier.main(argv)
    assert error in capsys.readouterr().err
