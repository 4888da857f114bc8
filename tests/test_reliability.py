"""TBA off the happy path, on the tiny model: searchers killed mid-run (SIGKILL, ray.kill) with 1 and 2 searchers,
a searcher that can never come back, a searcher that hangs, a reward function that raises or returns only NaN,
impossible buffer settings, and checkpoints restored into the same / another task."""

import os
import re
import signal
import sys
import tempfile
import threading
import time

import pytest
import ray
from ray.cloudpickle import register_pickle_by_value
from ray.tune.registry import register_env

from envs.redteam import RedTeamEnv
from envs.tldr import TLDREnv
from tba_tiny import tiny_config
from rllib_tba.tba import SampleWaitTimeout, SearcherFailure


class NaNRewardTLDR(TLDREnv):
    """Every reward is NaN (a broken reward model)."""

    def _score(self, prompts, completions):
        rewards, infos = super()._score(prompts, completions)
        return [float("nan")] * len(rewards), infos


class RaisingTLDR(TLDREnv):
    def _score(self, prompts, completions):
        raise ConnectionError("reward server unreachable")


HANG_FLAG = os.path.join(tempfile.gettempdir(), f"tba-test-hang-{os.getpid()}")  # (a value: pickled with the class)


class Hanging:
    """Once ``HANG_FLAG`` exists, the first searcher process to score claims it and never returns (a reward server
    that stopped answering); every other process, a replacement of the hung one included, scores as usual."""

    def _score(self, prompts, completions):
        if os.path.exists(HANG_FLAG):
            try:
                os.close(os.open(HANG_FLAG + ".claimed", os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                pass
            else:
                threading.Event().wait()
        return super()._score(prompts, completions)


class HangingTLDR(Hanging, TLDREnv):
    pass


class HangingRedTeam(Hanging, RedTeamEnv):
    pass


register_pickle_by_value(sys.modules[__name__])  # the searcher actors cannot import this test module by name
register_env("test/NaNReward-v0", lambda cfg: NaNRewardTLDR(cfg))
register_env("test/RaisingReward-v0", lambda cfg: RaisingTLDR(cfg))
register_env("test/HangingReward-v0", lambda cfg: HangingTLDR(cfg))
register_env("test/HangingRedTeam-v0", lambda cfg: HangingRedTeam(cfg))


# the red-team env on the tiny model whose novelty memory holds every scored attack (per searcher; "run": shared)
MEMORY_ENV = {"victim": "tiny-test", "victim_dtype": "float32", "victim_max_tokens": 4, "novelty_weight": 1.0,
              "novelty_against": "attacks"}
SHARED_MEMORY_ENV = {**MEMORY_ENV, "memory_scope": "run"}


def config(env="tba/TLDR-v0", env_config=None, num_env_runners=1, **training):
    training = {**dict(training_intensity=1.0, sample_wait_timeout_s=120), **training}
    return tiny_config(env, env_config, num_env_runners, **training).fault_tolerance(
        delay_between_env_runner_restarts_s=0)


def searcher_info(algo):
    """(pid, actor handle, weights version) of each healthy searcher."""
    return algo.env_runner_group.foreach_env_runner(
        lambda r: (os.getpid(), ray.get_runtime_context().current_actor, r.weights_version), local_env_runner=False)


def train_until(algo, done, limit_s=180):
    t0 = time.time()
    while not done():
        assert time.time() - t0 < limit_s, (
            f"training made no progress in {limit_s} s: weights version {algo.weights_version}, counters "
            f"{algo.counters}, generation requests in flight {algo._sampling}, weights requests in flight "
            f"{algo._weights_in_flight}, versions sent {algo.weights_sent}, per searcher {algo._searcher_calls}")
        algo.train()


@pytest.mark.parametrize("num_searchers, how", [(1, "sigkill"), (2, "ray.kill")])
def test_killed_searcher_is_replaced_and_training_finishes(ray_session, tiny_model, num_searchers, how):
    # training_intensity=1.0: the learner can only train on new samples, so without a working searcher train() stalls
    # sync_every=1000: no regular weight sync happens in this test, so a searcher holding a version > 0 got it from
    # the restart hand-over alone
    algo = config(num_env_runners=num_searchers, sync_every=1000).build_algo()
    try:
        for _ in range(3):
            algo.train()
        before = searcher_info(algo)
        assert all(version == 0 for _, _, version in before)
        victim_pid, victim_actor, _ = before[0]
        if how == "sigkill":
            os.kill(victim_pid, signal.SIGKILL)
        else:
            ray.kill(victim_actor, no_restart=False)
        received = algo.counters["samples_received"]
        train_until(algo, lambda: algo.counters["searcher_restarts"] >= 1)

        def newest_version():
            return max(s.weights_version for s in algo.buffer.samples())

        train_until(algo, lambda: newest_version() > 0)  # the replacement (it starts a vLLM engine first) delivers
        result = algo.train()
        info = searcher_info(algo)
        assert len(info) == num_searchers and victim_pid not in [pid for pid, _, _ in info]
        versions = sorted(version for _, _, version in info)
        # the replacement got the learner's weights and version at its restart; a surviving searcher still has 0
        assert 0 < versions[-1] <= algo.weights_version and versions[:-1] == [0] * (num_searchers - 1), versions
        assert algo.counters["samples_received"] > received + 8  # it samples again: the learner kept training
        assert result["tba"]["searcher_restarts"] >= 1 and result["tba"]["searchers_healthy"] == num_searchers
        # samples generated by the replacement are in the buffer, stamped with its version
        assert newest_version() == versions[-1]
    finally:
        algo.stop()


def test_no_searcher_left_raises_instead_of_waiting(ray_session, tiny_model):
    algo = config(sample_wait_timeout_s=5).build_algo()
    try:
        algo.train()
        _, actor, _ = searcher_info(algo)[0]
        ray.kill(actor, no_restart=True)
        t0 = time.time()
        with pytest.raises(SearcherFailure, match=r"no healthy searcher: all 1 searcher\(s\) failed .* within "
                                                  r"sample_wait_timeout_s=5 s"):
            for _ in range(50):
                algo.train()
        assert time.time() - t0 < 90
    finally:
        algo.stop()


@pytest.fixture
def hang_flag():
    """``HANG_FLAG``'s path, not created yet (a test creates it to make one searcher hang); removed after the test."""
    def remove():
        for path in (HANG_FLAG, HANG_FLAG + ".claimed"):
            if os.path.exists(path):
                os.remove(path)

    remove()
    yield HANG_FLAG
    remove()


def test_a_hung_searcher_is_killed_and_restarted_while_the_other_goes_on(ray_session, tiny_model, hang_flag, caplog):
    """A searcher whose reward call never returns would hold its requests for good, and with another searcher feeding
    the learner nothing would ever time out: it is killed after sample_wait_timeout_s without an answer, counted,
    and restarted; its replacement delivers samples again."""
    algo = config("test/HangingReward-v0", num_env_runners=2, sample_wait_timeout_s=10).build_algo()
    try:
        algo.train()
        open(hang_flag, "w").close()
        with caplog.at_level("WARNING", logger="rllib_tba.tba"):
            train_until(algo, lambda: algo.counters["searcher_restarts"] >= 1)
        assert os.path.exists(hang_flag + ".claimed")  # one searcher did hang
        assert algo.counters["searcher_stalls"] == 1
        assert re.search(r"searcher [12] answered none of its generation requests for over sample_wait_timeout_s=10 s",
                         caplog.text)
        calls = {who: mine["calls"] for who, mine in algo._searcher_calls.items()}
        train_until(algo, lambda: all(algo._searcher_calls[who]["calls"] > n for who, n in calls.items()))
        assert algo.counters["searcher_stalls"] == 1
    finally:
        algo.stop()


def test_stop_does_not_wait_for_a_hung_searcher(ray_session, tiny_model, hang_flag):
    """``algo.stop()`` (Ctrl-C, the end of a Tune trial) must not wait behind a searcher's queued generation calls,
    let alone a call that never returns."""
    algo = config("test/HangingReward-v0", num_env_runners=2).build_algo()
    stopped = False
    try:
        algo.train()
        open(hang_flag, "w").close()
        train_until(algo, lambda: os.path.exists(hang_flag + ".claimed"))
        t0 = time.time()
        algo.stop()
        stopped = True
        assert time.time() - t0 < 30
    finally:
        if not stopped:
            algo.stop()


def test_a_checkpoint_with_a_hung_searcher_is_bounded_and_keeps_its_env_state_copy(ray_session, tiny_model, hang_flag):
    """Saving asks every searcher for its env state, an answer that waits behind its generation calls: a hung one
    is killed as stalled after sample_wait_timeout_s, and the checkpoint holds the copy from its last weight sync.
    (60 s: a red-team searcher's first call loads the victim and the embedder, which took over 10 s in a CI run.)"""
    from rllib_tba.tba import _TBA_STATE

    algo = config("test/HangingRedTeam-v0", MEMORY_ENV, num_env_runners=2, sync_every=1,
                  sample_wait_timeout_s=60).build_algo()
    try:
        train_until(algo, lambda: 1 in algo._env_state_copies and 2 in algo._env_state_copies)
        open(hang_flag, "w").close()
        train_until(algo, lambda: os.path.exists(hang_flag + ".claimed"))
        t0 = time.time()
        saved = algo.get_state()[_TBA_STATE]["env_states"]
        assert time.time() - t0 < 90 and algo.counters["searcher_stalls"] == 1
        assert set(saved) == {1, 2} and all(len(state["novelty"]["embeddings"]) for state in saved.values())
    finally:
        algo.stop()


def test_a_hung_searcher_in_sync_mode_ends_in_a_bounded_wait(ray_session, tiny_model, hang_flag):
    """Lock-step generation waits for every searcher: a hung one is killed after sample_wait_timeout_s, and with no
    replacement allowed the wait ends in an error instead of blocking train() forever."""
    algo = config("test/HangingReward-v0", async_mode=False, training_intensity=None, sample_wait_timeout_s=5
                  ).fault_tolerance(restart_failed_env_runners=False).build_algo()
    try:
        algo.train()
        open(hang_flag, "w").close()
        t0 = time.time()
        with pytest.raises((SampleWaitTimeout, SearcherFailure)):
            for _ in range(20):
                algo.train()
        assert time.time() - t0 < 60 and algo.counters["searcher_stalls"] == 1
    finally:
        algo.stop()


def test_reward_function_error_in_searcher_is_raised_with_its_message(ray_session, tiny_model):
    algo = config(env="test/RaisingReward-v0").build_algo()
    try:
        with pytest.raises(SearcherFailure, match=r"searcher 1 failed while sampling: RewardError: RaisingTLDR reward "
                                                  r"function failed .*ConnectionError: reward server unreachable"):
            algo.train()
    finally:
        algo.stop()


def test_all_rewards_dropped_fails_fast_with_a_diagnosis(ray_session, tiny_model):
    algo = config(env="test/NaNReward-v0", env_config={"on_invalid_reward": "drop"}).build_algo()
    try:
        t0 = time.time()
        with pytest.raises(SampleWaitTimeout, match=r"initial fill .*no usable sample — all \d+ rewards were "
                                                    r"non-finite and dropped"):
            algo.train()
        assert time.time() - t0 < 60
    finally:
        algo.stop()


def test_sync_mode_wait_is_bounded_too(ray_session, tiny_model):
    algo = config(env="test/NaNReward-v0", env_config={"on_invalid_reward": "drop"}, async_mode=False,
                  num_env_runners=0, training_intensity=None).build_algo()
    try:
        with pytest.raises(SampleWaitTimeout, match="non-finite and dropped"):
            algo.train()
    finally:
        algo.stop()


def test_env_config_error_is_named_not_an_index_error(ray_session, tiny_model):
    with pytest.raises(ValueError, match=r"the task 'tba/TLDR-v0' could not be built from its env_config: ValueError: "
                                         r"TLDREnv: unknown config keys \['max_new_token'\]"):
        config(env_config={"max_new_token": 8}).build_algo()


def test_unreachable_min_buffer_size_is_rejected_at_build(ray_session, tiny_model):
    # the stand-in TL;DR data has 24 prompts: 24 x per_prompt_capacity 1 can never reach 30 samples
    with pytest.raises(ValueError, match=r"min_buffer_size=30 can never be reached: .* = 24 samples"):
        config(per_prompt_capacity=1, min_buffer_size=30, num_env_runners=0, async_mode=False).build_algo()


def test_restore_keeps_fresh_flags_and_refuses_another_task(ray_session, tiny_model, tmp_path):
    algo = config(sync_every=1000).build_algo()  # no sync after the fill: every sample stays most-on-policy
    try:
        for _ in range(2):
            algo.train()
        fresh = algo.buffer.get_state()["fresh_keys"]
        assert fresh
        algo.save_to_path(str(tmp_path / "ckpt"))
        version = algo.weights_version
    finally:
        algo.stop()

    same = config(sync_every=1000, num_env_runners=0, async_mode=False).build_algo()
    try:
        same.restore_from_path(str(tmp_path / "ckpt"))
        assert same.buffer.get_state()["fresh_keys"] == fresh and same.weights_version == version
        assert same.env_runner.weights_version == version
    finally:
        same.stop()

    for env, env_config, message in [
        ("tba/Math-v0", {"dataset": "basic_arithmetic", "size": 32}, r"another task: it was trained on 'tba/TLDR-v0', "
                                                                    r"this run uses 'tba/Math-v0'"),
        ("tba/TLDR-v0", {"template": "Summarise: {post}"}, r"another prompt set: it was trained on 24 prompts"),
    ]:
        other = config(env=env, env_config=env_config, num_env_runners=0, async_mode=False, min_buffer_size=4).build_algo()
        try:
            with pytest.raises(ValueError, match=message):
                other.restore_from_path(str(tmp_path / "ckpt"))
            assert other.weights_version == 0 and len(other.buffer) == 0  # nothing was overwritten
        finally:
            other.stop()


def test_a_checkpoint_carries_each_searcher_s_novelty_memory(ray_session, tiny_model, tmp_path, caplog):
    """The red-team env's novelty memory (novelty_against="attacks": every scored attack, so the tiny victim's
    failures fill it) is saved per searcher with the checkpoint and handed back on restore, to the same searcher when
    the run has as many; with fewer searchers the states left over are counted and logged."""
    import numpy as np

    from rllib_tba.checkpoint_files import read_checkpoint_state

    algo = config("tba/RedTeam-v0", MEMORY_ENV, num_env_runners=2).build_algo()
    try:
        for _ in range(2):
            algo.train()
        algo.save_to_path(str(tmp_path / "ckpt"))
    finally:
        algo.stop()
    saved = read_checkpoint_state(tmp_path / "ckpt")["tba"]["env_states"]
    assert sorted(saved) == [1, 2] and any(len(s["novelty"]["embeddings"]) for s in saved.values())

    def memories(states):
        return {i: s["novelty"]["embeddings"] for i, s in states.items()}

    same = config("tba/RedTeam-v0", MEMORY_ENV, num_env_runners=2, async_mode=False).build_algo()
    try:
        assert not any(len(m) for m in memories(same._searcher_env_states()).values())  # new searchers: empty
        same.restore_from_path(str(tmp_path / "ckpt"))
        restored = memories(same._searcher_env_states())
        assert sorted(restored) == [1, 2]
        for i, rows in memories(saved).items():
            assert np.array_equal(restored[i], rows)
        assert same.counters["searcher_env_states_not_restored"] == 0
    finally:
        same.stop()

    fewer = config("tba/RedTeam-v0", MEMORY_ENV, num_env_runners=0, async_mode=False).build_algo()
    try:
        with caplog.at_level("WARNING", logger="rllib_tba.tba"):
            fewer.restore_from_path(str(tmp_path / "ckpt"))
        assert np.array_equal(fewer.env_runner.env.get_state()["novelty"]["embeddings"], memories(saved)[1])
        assert fewer.counters["searcher_env_states_not_restored"] == 1
        assert "states of 2 searchers, this run has 1: those of searchers [2] are not restored" in caplog.text
    finally:
        fewer.stop()


def test_a_restarted_searcher_gets_back_its_task_env_state(ray_session, tiny_model, caplog):
    """A searcher's env keeps what scoring learned (here the novelty memory of every scored attack); its weight syncs
    hand a copy to the driver, and a restarted searcher gets the copy back instead of an empty memory. A searcher that
    dies before its first sync has no copy: counted and logged, not silent."""
    import numpy as np

    algo = config("tba/RedTeam-v0", MEMORY_ENV, num_env_runners=2, sync_every=1).build_algo()

    def actors():
        return dict(algo.env_runner_group.foreach_env_runner(
            lambda r: (r.worker_index, ray.get_runtime_context().current_actor), local_env_runner=False))

    def memory(i):
        return algo.env_runner_group.foreach_env_runner(lambda r: r.env.get_state()["novelty"]["embeddings"],
                                                        local_env_runner=False, remote_worker_ids=[i])[0]

    def copied_rows(i):
        return len(algo._env_state_copies.get(i, {}).get("novelty", {}).get("embeddings", []))

    try:
        ray.kill(actors()[2], no_restart=False)  # before any weight sync: nothing was copied yet
        with caplog.at_level("WARNING", logger="rllib_tba.tba"):
            train_until(algo, lambda: algo.counters["searcher_restarts"] >= 1)
        assert algo.counters["searcher_env_states_lost"] == 1
        assert algo.counters["searcher_env_states_handed_back"] == 0
        assert "searcher 2 restarted before its task-env state was ever copied" in caplog.text

        train_until(algo, lambda: copied_rows(1) > 0 and copied_rows(2) > 0)  # the syncs copy both envs' states
        copy = np.array(algo._env_state_copies[1]["novelty"]["embeddings"])
        ray.kill(actors()[1], no_restart=False)
        train_until(algo, lambda: algo.counters["searcher_restarts"] >= 2)
        assert algo.counters["searcher_env_states_handed_back"] == 1
        assert algo.counters["searcher_env_states_lost"] == 1
        # the new searcher's memory starts with what its predecessor had (a later copy, fetched after the one read
        # here, only adds rows), then grows with what it scores itself
        rows = memory(1)
        assert len(rows) >= len(copy) > 0 and np.array_equal(rows[:len(copy)], copy)
    finally:
        algo.stop()


def searcher_memory(algo, i):
    """Searcher ``i``'s novelty memory (its env's embeddings) as a set of rows."""
    import numpy as np

    rows = algo.env_runner_group.foreach_env_runner(lambda r: r.env.get_state()["novelty"]["embeddings"],
                                                    local_env_runner=False, remote_worker_ids=[i])[0]
    return {row.tobytes() for row in np.asarray(rows)}


def test_searchers_share_their_envs_news_at_weight_syncs_under_memory_scope_run(ray_session, tiny_model):
    """memory_scope="run": each sync's reply carries what a searcher's env remembered since its last one, and the
    driver sends it with the other searcher's next weights. So once the driver has sent searcher 1 weights twice after
    searcher 2's reply, every row of searcher 2's memory as of that reply is in searcher 1's memory (the memory holds
    every attack here): the memory query below runs on searcher 1 after those weights requests, answered or not (a Ray
    actor runs one caller's calls in order). A checkpoint saves the news not yet delivered.

    The wait is on a count that only grows: "no weights request in flight to searcher 1" is true only between its
    reply and the next update's sync, so whether ``train()`` returns in that gap depends on the machine's timing (here
    it did after ~1 in 5 iterations; a CI run waited 180 s for it in vain)."""
    import numpy as np

    from rllib_tba.tba import _TBA_STATE

    algo = config("tba/RedTeam-v0", SHARED_MEMORY_ENV, num_env_runners=2, sync_every=1).build_algo()
    try:
        train_until(algo, lambda: len(algo._env_state_copies.get(2, {}).get("novelty", {}).get("embeddings", [])) > 0)
        copy = {row.tobytes() for row in np.asarray(algo._env_state_copies[2]["novelty"]["embeddings"])}
        syncs = len(algo.versions_sent(1))
        train_until(algo, lambda: len(algo.versions_sent(1)) >= syncs + 2)
        assert copy <= searcher_memory(algo, 1)
        assert algo.counters["searcher_env_news_shared"] >= 2
        saved = algo.get_state()[_TBA_STATE]
        assert set(saved["env_news"]) <= {1, 2} and set(saved["env_states"]) == {1, 2}
        assert all(len(news["novelty"]["embeddings"]) for news in saved["env_news"].values())
    finally:
        algo.stop()


def test_news_sent_to_a_searcher_that_dies_before_taking_it_in_reaches_its_replacement(ray_session, tiny_model):
    """memory_scope="run": the others' news travels with a searcher's weights. A searcher that dies with it unread
    would lose it for good (its replacement gets its env state as of its last sync, before that news): the driver
    keeps what it sent until the reply and sends it again to the restarted searcher."""
    import numpy as np

    algo = config("tba/RedTeam-v0", SHARED_MEMORY_ENV, num_env_runners=2, sync_every=1).build_algo()
    try:
        # searcher 2's news waits for searcher 1's next sync, and searcher 1 has synced before (a copy to hand back)
        train_until(algo, lambda: bool(algo._news_outbox.get(1)) and 1 in algo._env_state_copies)
        actor = algo.env_runner_group.foreach_env_runner(lambda r: ray.get_runtime_context().current_actor,
                                                         local_env_runner=False, remote_worker_ids=[1])[0]
        ray.kill(actor, no_restart=False)
        algo._push_weights(block=True, to=[1], mark_sync=False)  # a sync that reaches a dead searcher
        unread = {row.tobytes() for row in np.asarray(algo._news_sent[1]["novelty"]["embeddings"])}
        assert unread and not algo._news_outbox.get(1)
        train_until(algo, lambda: algo.counters["searcher_restarts"] >= 1)
        assert algo.counters["searcher_env_states_handed_back"] == 1 and 1 not in algo._news_sent
        assert unread <= searcher_memory(algo, 1)
    finally:
        algo.stop()


def test_a_server_stops_on_a_signal_whichever_thread_the_kernel_handed_it_to():
    """``rllib serve`` blocks in ``wait_for_stop``. A process's SIGINT may reach a thread other than the main one
    (Ray's and gRPC's threads do not block it): Python then runs the handler only when the main thread next runs
    Python code, which a single long sleep put off for good. And a KeyboardInterrupt caught inside Ray code must
    still stop the server. A watchdog signals the main thread after 10 s, so a hang fails the test instead of
    blocking it."""
    import threading

    from rllib_tba.local_ray import stop_on_signals, wait_for_stop

    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    idle = threading.Event()
    other = threading.Thread(target=idle.wait, daemon=True)
    other.start()
    watchdog = threading.Timer(10, signal.pthread_kill, (threading.main_thread().ident, signal.SIGINT))
    try:
        stopping = stop_on_signals()
        threading.Timer(0.3, signal.pthread_kill, (other.ident, signal.SIGINT)).start()
        watchdog.start()
        start = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            wait_for_stop(stopping, poll_s=0.5)
        assert time.monotonic() - start < 3 and stopping.is_set()
        watchdog.cancel()

        stopping = stop_on_signals()
        try:  # as Ray code that catches the KeyboardInterrupt and goes on
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)
        except KeyboardInterrupt:
            pass
        start = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            wait_for_stop(stopping)
        assert time.monotonic() - start < 0.5
    finally:
        watchdog.cancel()
        idle.set()
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def test_a_tune_state_file_cut_by_a_kill_is_repaired_from_the_session_s_staging_copy(tmp_path):
    """`rllib train --resume` after a SIGKILL that landed while Tune copied its experiment state to storage (seen in
    CI: a 0-byte experiment_state file, and the resume started a new trial from scratch): the newest session's
    state files that do not read are replaced by the interrupted session's staging copies, and the trial logs by
    theirs where those extend them; a trial log cut inside a line loses that line; with the state intact only a log
    left in mid-copy takes the staging lines; intact files and other sessions' files are left alone; with no intact
    copy left the
    error names the damaged file and the latest checkpoint to --restore."""
    import json
    import pickle

    from rllib_tba.checkpoint_files import CheckpointError, repair_experiment_state

    exp, sessions = tmp_path / "results" / "my_exp", tmp_path / "ray"
    old, new = "2026-12-07_01-00-00", "2026-12-07_02-00-00"
    staging = sessions / "session_2" / "artifacts" / new / "my_exp" / "driver_artifacts"
    staging.mkdir(parents=True)
    (exp / "TBA_trial" / "checkpoint_000001").mkdir(parents=True)
    (exp / "TBA_trial" / "checkpoint_000001" / "algorithm_state.pkl").write_bytes(b"x")
    state = {"trial_data": ["the trial"], "runner_data": {}, "stats": {}}
    (staging / f"experiment_state-{new}.json").write_text(json.dumps(state))
    (staging / f"basic-variant-state-{new}.json").write_bytes(pickle.dumps({"_finished": True}))
    (exp / f"experiment_state-{old}.json").write_text("")  # an earlier session's: Tune reads only the newest
    (exp / f"experiment_state-{new}.json").write_text("")  # cut to 0 bytes by the kill
    (exp / f"basic-variant-state-{new}.json").write_bytes(pickle.dumps({"_finished": True})[:5])
    rows = "".join(f'{{"training_iteration": {i}}}\n' for i in (1, 2, 3))
    (exp / "TBA_trial" / "result.json").write_text(rows[:60])  # 2 rows and a cut one
    (staging / "TBA_trial").mkdir()
    (staging / "TBA_trial" / "result.json").write_text(rows)  # what the staging state records
    (exp / "TBA_other").mkdir()
    (exp / "TBA_other" / "result.json").write_text('{"a": 1}\n{"a": 2}\n{"a"')
    (staging / "TBA_other").mkdir()
    (staging / "TBA_other" / "result.json").write_text('{"b": 1}\n')  # not its continuation: only the cut goes
    (exp / "TBA_trial" / "progress.csv").write_bytes(b"training_iteration\r\n1\r\n2\r\n")  # csv's line ends
    repaired = repair_experiment_state(exp, sessions)
    assert [str(f.relative_to(exp)) for f in repaired] == [f"experiment_state-{new}.json",
                                                          f"basic-variant-state-{new}.json",
                                                          "TBA_other/result.json", "TBA_trial/result.json"]
    assert json.loads((exp / f"experiment_state-{new}.json").read_text()) == state
    assert pickle.loads((exp / f"basic-variant-state-{new}.json").read_bytes()) == {"_finished": True}
    assert (exp / "TBA_trial" / "result.json").read_text() == rows
    assert (exp / "TBA_other" / "result.json").read_text() == '{"a": 1}\n{"a": 2}\n'
    assert (exp / "TBA_trial" / "progress.csv").read_bytes() == b"training_iteration\r\n1\r\n2\r\n"
    assert (exp / f"experiment_state-{old}.json").read_text() == "" and not list(exp.glob(".*repair"))
    assert repair_experiment_state(exp, sessions) == []  # all intact now
    # the state intact (also seen in CI): a trial log emptied by the kill, its trial checkpointed, takes the staging
    # lines; a whole log that is only behind the staging one goes with the stored state and stays
    (exp / "TBA_trial" / "result.json").write_text("")
    (exp / "TBA_other" / "result.json").write_text("")  # no checkpoint: it may not have logged yet
    (staging / "TBA_other" / "result.json").write_text('{"a": 1}\n')
    (exp / "TBA_trial" / "progress.csv").write_bytes(b"training_iteration\r\n1\r\n")
    (staging / "TBA_trial" / "progress.csv").write_bytes(b"training_iteration\r\n1\r\n2\r\n")
    assert [str(f.relative_to(exp)) for f in repair_experiment_state(exp, sessions)] == ["TBA_trial/result.json"]
    assert (exp / "TBA_trial" / "result.json").read_text() == rows
    assert (exp / "TBA_other" / "result.json").read_text() == ""
    assert (exp / "TBA_trial" / "progress.csv").read_bytes() == b"training_iteration\r\n1\r\n"
    assert repair_experiment_state(tmp_path / "no_experiment", sessions) == []
    (exp / f"experiment_state-{new}.json").write_text('{"trial_data": [')  # cut, and the staging copy cut too
    (staging / f"experiment_state-{new}.json").write_text('{"trial_')
    with pytest.raises(CheckpointError, match=rf"experiment_state-{new}.json is damaged \(16 bytes.*no intact copy "
                                              rf"is left in {sessions}; continue .* --restore {exp}/TBA_trial/"
                                              r"checkpoint_000001"):
        repair_experiment_state(exp, sessions)
