"""TBA replay buffer: draw frequencies (m, softmax), eviction, dedup, checkpoint state."""

import numpy as np
import pytest
import replay_cluster_cost  # benchmarks/ (on the path by conftest.py)
import replay_report

from rllib_tba.tba_replay_buffer import TBAReplayBuffer, TBSample


def sample(key, tokens, reward=0.0, weights_version=0):
    return TBSample(prompt_key=key, prompt_ids=(1, 2, key), completion=np.asarray(tokens, np.int32), reward=reward,
                    weights_version=weights_version)


def filled(seed=0, **kw):
    buf = TBAReplayBuffer(seed=seed, **kw)
    for key in range(10):
        buf.add([sample(key, [key, j], reward=j) for j in range(6)])
    return buf


def within(count, n, p, sigmas=5):
    return abs(count - n * p) <= sigmas * np.sqrt(n * p * (1 - p)) + 1


@pytest.mark.parametrize("m", [0.0, 0.3, 0.95])
def test_on_policy_draw_frequency_is_m(m):
    buf = filled()
    buf.mark_sync()
    buf.add([sample(k, [k, 100 + j], weights_version=1) for k in (2, 7) for j in range(4)])  # fresh: prompts 2 and 7
    n = 4000
    samples, groups, on = buf.sample(n, 3, m)
    draws = on[::3]
    assert within(draws.sum(), n, m)
    fresh_groups = set(groups[on])
    assert fresh_groups <= {2, 7}
    assert all(s.weights_version == 1 for s, o in zip(samples, on) if o)  # on-policy draws use fresh samples only
    assert buf.stats["on_policy_draws"] == draws.sum()


def test_off_policy_draws_follow_softmax_of_reward():
    buf = TBAReplayBuffer(seed=1)
    rewards = [0.0, 0.5, 1.0, 2.0]
    buf.add([sample(0, [i], reward=r) for i, r in enumerate(rewards)])
    n = 20000
    samples, _, on = buf.sample(n // 4, 4, m=0.0, reward_inv_temp=1.5)
    assert not on.any()
    counts = np.bincount([int(s.completion[0]) for s in samples], minlength=4)
    p = np.exp(1.5 * np.asarray(rewards))
    p /= p.sum()
    for c, pi in zip(counts, p):
        assert within(c, n, pi)
    uniform, _, _ = buf.sample(n // 4, 4, m=0.0, reward_inv_temp=0.0)
    for c in np.bincount([int(s.completion[0]) for s in uniform], minlength=4):
        assert within(c, n, 0.25)


def test_on_policy_tops_up_with_newest_when_few_fresh():
    buf = TBAReplayBuffer(seed=0)
    buf.add([sample(0, [j]) for j in range(5)])
    buf.mark_sync()
    buf.add([sample(0, [99], weights_version=3)])
    samples, _, on = buf.sample(1, 3, m=1.0)
    assert on.all() and [int(s.completion[0]) for s in samples] == [99, 4, 3]


def test_no_fresh_prompt_falls_back_to_off_policy():
    buf = filled()
    buf.mark_sync()
    _, _, on = buf.sample(10, 2, m=1.0)
    assert not on.any() and buf.stats["on_policy_fallbacks"] == 10


def test_per_prompt_capacity_keeps_the_newest():
    buf = TBAReplayBuffer(capacity=10, per_prompt_capacity=4, seed=0)
    buf.add([sample(0, [j]) for j in range(6)])
    buf.add([sample(1, [j]) for j in range(8)])
    kept = [(k, int(c[0])) for k, _, c, *_ in buf.get_state()["samples"]]
    assert kept == [(0, 2), (0, 3), (0, 4), (0, 5), (1, 4), (1, 5), (1, 6), (1, 7)]
    assert len(buf) == 8 and buf.stats["evicted"] == 6


def test_global_fifo_order_across_prompts():
    buf = TBAReplayBuffer(capacity=5, per_prompt_capacity=100, seed=0)
    buf.add([sample(j % 2, [j]) for j in range(8)])
    assert [int(c[0]) for _, _, c, *_ in buf.get_state()["samples"]] == [3, 4, 5, 6, 7]


def test_lowest_reward_eviction():
    buf = TBAReplayBuffer(capacity=4, eviction="lowest_reward", seed=0)
    buf.add([sample(j % 3, [j], reward=r) for j, r in enumerate([5, 1, 9, 3, 7, 0, 8])])
    rewards = sorted(r for _, _, _, r, *_ in buf.get_state()["samples"])
    assert rewards == [5, 7, 8, 9]


def test_dedup_identical_token_sequences():
    buf = TBAReplayBuffer(seed=0)
    assert buf.add([sample(0, [1, 2]), sample(0, [1, 2]), sample(1, [1, 2]), sample(0, [1, 2, 3])]) == 3
    assert buf.stats["duplicates"] == 1 and len(buf) == 3


def test_state_round_trip_reproduces_draws():
    buf = filled(seed=3, capacity=50)
    buf.mark_sync()
    buf.add([sample(4, [4, 77], weights_version=2)])
    state = buf.get_state()
    other = TBAReplayBuffer(capacity=50, seed=99)
    other.set_state(state)
    a = buf.sample(20, 3, m=0.5, reward_inv_temp=0.7)
    b = other.sample(20, 3, m=0.5, reward_inv_temp=0.7)
    assert [(s.prompt_key, s.completion.tolist(), s.weights_version) for s in a[0]] == \
           [(s.prompt_key, s.completion.tolist(), s.weights_version) for s in b[0]]
    assert (a[2] == b[2]).all() and len(other) == len(buf)


def test_bad_arguments():
    with pytest.raises(ValueError, match="eviction"):
        TBAReplayBuffer(eviction="random")
    with pytest.raises(ValueError, match="empty"):
        TBAReplayBuffer().sample(1, 1, 0.5)


def test_softmax_draws_stay_exact_after_evictions_leave_holes():
    """Lowest-reward eviction frees slots in the middle of a group; draws over what is left still follow the softmax
    (5 sigma), and an evicted sample is never drawn."""
    buf = TBAReplayBuffer(capacity=5, per_prompt_capacity=100, eviction="lowest_reward", seed=2)
    buf.add([sample(0, [i], reward=r) for i, r in enumerate([3.0, -1.0, 0.0, 2.0, -2.0, 1.0, 4.0])])
    kept = {int(s.completion[0]): s.reward for s in buf.samples()}
    assert kept == {0: 3.0, 2: 0.0, 3: 2.0, 5: 1.0, 6: 4.0}
    n = 20000
    drawn, _, _ = buf.sample(n // 4, 4, m=0.0, reward_inv_temp=0.8)
    counts = {i: 0 for i in kept}
    for s in drawn:
        counts[int(s.completion[0])] += 1
    z = sum(np.exp(0.8 * r) for r in kept.values())
    for i, r in kept.items():
        assert within(counts[i], n, np.exp(0.8 * r) / z)
    buf.add([sample(0, [7], reward=10.0)])  # reuses a freed slot, updates the weights in place
    drawn, _, _ = buf.sample(200, 4, m=0.0, reward_inv_temp=0.8)
    assert np.mean([int(s.completion[0]) == 7 for s in drawn]) > 0.9  # e^(0.8*6) ~ 121x the next one


def test_one_large_prompt_group_draws_match_softmax():
    """The red-team layout: every sample in ONE prompt group (sum tree over 3000 slots, rebuilt as it grows)."""
    buf = TBAReplayBuffer(capacity=10_000, per_prompt_capacity=10_000, seed=4)
    rewards = np.repeat([0.0, 1.0, 2.0], 1000)
    for chunk in np.array_split(np.arange(3000), 7):  # draws between adds: the tree is built, then grown
        buf.add([sample(0, [int(i)], reward=float(rewards[i])) for i in chunk])
        buf.sample(1, 2, m=0.0, reward_inv_temp=1.0)
    n = 30000
    drawn, _, _ = buf.sample(n // 10, 10, m=0.0, reward_inv_temp=1.0)
    levels = np.bincount([int(rewards[int(s.completion[0])]) for s in drawn], minlength=3)
    p = np.exp([0.0, 1.0, 2.0]) / np.exp([0.0, 1.0, 2.0]).sum()
    for c, pi in zip(levels, p):
        assert within(c, n, pi)


def test_drop_older_than_evicts_stale_samples_and_counts_them():
    buf = TBAReplayBuffer(seed=0)
    buf.add([sample(k, [k, v], weights_version=v) for k in range(3) for v in range(5)])
    assert buf.drop_older_than(3) == 9 and len(buf) == 6 and buf.stats["stale_evicted"] == 9
    assert buf.stats["evicted"] == 0
    drawn, _, _ = buf.sample(500, 2, m=0.5, reward_inv_temp=1.0)
    assert min(s.weights_version for s in drawn) == 3
    assert buf.drop_older_than(3) == 0
    assert buf.drop_older_than(10) == 6 and len(buf) == 0 and buf.num_prompts == 0


def test_state_round_trip_with_holes_reproduces_draws():
    buf = TBAReplayBuffer(capacity=12, eviction="lowest_reward", seed=5)
    rng = np.random.default_rng(0)
    buf.add([sample(j % 2, [j], reward=float(rng.normal())) for j in range(30)])
    other = TBAReplayBuffer(capacity=12, eviction="lowest_reward", seed=9)
    other.set_state(buf.get_state())
    for it in range(3):  # the two stay identical through new adds (reusing freed slots) and draws
        new = [float(rng.normal()) for _ in range(3)]
        for b in (buf, other):
            b.add([sample(j % 2, [100 + 10 * it + j], reward=r) for j, r in enumerate(new)])
        a = buf.sample(10, 4, m=0.3, reward_inv_temp=1.3)
        b = other.sample(10, 4, m=0.3, reward_inv_temp=1.3)
        assert [int(s.completion[0]) for s in a[0]] == [int(s.completion[0]) for s in b[0]]


def jaccard(a, b):
    a, b = set(a), set(b)
    return len(a & b) / len(a | b)


def test_near_duplicate_clusters_follow_token_set_jaccard():
    """A completion joins the oldest live cluster whose first member's token set is >= threshold Jaccard-similar
    (known answers from the formula), else starts one; a cluster whose members are all evicted is gone."""
    first, close, other, far, same_set = [1, 2, 3, 4], [1, 2, 3, 5], [6, 7], [1, 2, 8, 9], [7, 6, 7]
    assert jaccard(first, close) == 0.6 and jaccard(first, far) == pytest.approx(1 / 3) and jaccard(other, same_set) == 1
    buf = TBAReplayBuffer(capacity=5, per_prompt_capacity=5, seed=0, near_duplicate_jaccard=0.5)
    buf.add([sample(0, t) for t in (first, close, other, far, same_set)])
    group = buf._groups[0]
    clusters = [int(group.cluster_of[s.slot]) for s in buf.samples()]
    assert clusters == [0, 0, 1, 2, 1] and group.clusters.sizes == [2, 2, 1] and buf.num_clusters == 3
    # evicting `first` (fifo) keeps cluster 0 and its leader: [1, 2, 3, 6] is 3/5 like `first`, 3/6 to `close`
    buf.add([sample(0, [1, 2, 3, 6])])
    assert int(group.cluster_of[buf._groups[0].order[-1].slot]) == 0
    buf.add([sample(0, [20, 21]), sample(0, [22, 23])])  # evicts `close` and `other`: cluster 1 keeps `same_set`
    assert group.clusters.sizes[:2] == [1, 1]
    buf.add([sample(0, [24, 25]), sample(0, [26, 27])])  # evicts `far` and `same_set`: clusters 1 and 2 are gone
    assert group.clusters.leaders[1] is None and group.clusters.leaders[2] is None and buf.num_clusters == 5
    buf.add([sample(0, [6, 7, 30])])  # similar to cluster 1's old leader: a new cluster (ids are never reused)
    assert int(group.cluster_of[buf._groups[0].order[-1].slot]) == 7


def test_near_duplicate_spread_draws_each_cluster_by_its_mean_weight():
    """Off-policy draws with clusters: P(cluster) ∝ mean of its members' softmax weights, uniform-by-weight inside
    it. Nine near-copies of one reward-2 completion are drawn as often as one distinct reward-2 completion."""
    buf = TBAReplayBuffer(capacity=100, per_prompt_capacity=100, seed=6, near_duplicate_jaccard=0.6)

    def samples():  # nine copies (Jaccard 5/7 with the first) and three distinct completions
        return [sample(0, [1, 2, 3, 4, 5, 10 + i], reward=2.0) for i in range(9)] + [
            sample(0, [40, 41, 42], reward=2.0), sample(0, [50, 51], reward=1.0), sample(0, [60, 61, 62, 10])]

    buf.add(samples())
    assert buf._groups[0].clusters.sizes == [9, 1, 1, 1]
    n = 40000
    drawn, _, _ = buf.sample(n // 8, 8, m=0.0, reward_inv_temp=0.5)
    first = np.asarray([int(s.completion[0]) for s in drawn])
    w = np.exp(0.5 * np.asarray([2.0, 2.0, 1.0, 0.0]))  # each cluster's mean weight
    p = w / w.sum()
    for token, pi in zip((1, 40, 50, 60), p):
        assert within((first == token).sum(), n, pi)
    copy_counts = np.bincount([int(s.completion[-1]) - 10 for s in drawn if s.completion[0] == 1], minlength=9)
    assert all(within(c, n, p[0] / 9) for c in copy_counts)  # inside a cluster: by weight (here equal)
    plain = TBAReplayBuffer(capacity=100, per_prompt_capacity=100, seed=6)  # off: each copy is drawn on its own
    plain.add(samples())
    drawn, _, _ = plain.sample(n // 8, 8, m=0.0, reward_inv_temp=0.5)
    assert within(sum(int(s.completion[0]) == 1 for s in drawn), n, 9 * w[0] / (9 * w[0] + w[1:].sum()))


def test_state_round_trip_keeps_near_duplicate_clusters():
    """A checkpoint restores each sample's cluster and each cluster's leader (even an evicted one), so draws and
    later assignments continue identically."""
    kw = dict(capacity=6, per_prompt_capacity=6, near_duplicate_jaccard=0.5)
    buf = TBAReplayBuffer(seed=7, **kw)
    buf.add([sample(0, t, reward=float(i)) for i, t in enumerate(
        [[1, 2, 3, 4], [5, 6], [1, 2, 3, 9], [5, 6, 7], [10, 11], [1, 2, 4, 8], [12, 13]])])  # evicts the leader [1,2,3,4]
    other = TBAReplayBuffer(seed=8, **kw)
    other.set_state(buf.get_state())
    for b in (buf, other):
        b.add([sample(0, [1, 3, 4, 20], reward=3.0)])  # 3/5 like the evicted leader, 2/6 like [1, 2, 3, 9]
    assert [int(other._groups[0].cluster_of[s.slot]) for s in other.samples()] == \
           [int(buf._groups[0].cluster_of[s.slot]) for s in buf.samples()]
    assert int(buf._groups[0].cluster_of[buf._groups[0].order[-1].slot]) == 0
    a, b = buf.sample(20, 4, m=0.3, reward_inv_temp=0.9), other.sample(20, 4, m=0.3, reward_inv_temp=0.9)
    assert [s.completion.tolist() for s in a[0]] == [s.completion.tolist() for s in b[0]]


def test_near_duplicate_jaccard_must_be_a_fraction():
    with pytest.raises(ValueError, match=r"near_duplicate_jaccard must be in \[0, 1\]"):
        TBAReplayBuffer(near_duplicate_jaccard=1.5)


def test_off_policy_probabilities_are_what_draws_follow():
    """The reported probabilities equal the softmax (divided by cluster size with clusters), computed here by hand,
    and asking for them does not disturb later draws."""
    rewards = [0.0, 1.0, 1.0, 2.0]
    tokens = [[1, 2], [3, 4, 5], [3, 4, 6], [7, 8]]  # the two reward-1 samples are near-duplicates (Jaccard 1/2)
    for jaccard, sizes in ((0.0, [1, 1, 1, 1]), (0.5, [1, 2, 2, 1])):
        buf = TBAReplayBuffer(seed=3, near_duplicate_jaccard=jaccard)
        buf.add([sample(0, t, reward=r) for t, r in zip(tokens, rewards)])
        buf.sample(2, 2, m=0.0, reward_inv_temp=0.7)  # a tree exists before the question
        stored, p = buf.off_policy_probabilities(0, reward_inv_temp=1.3)
        w = np.exp(1.3 * np.asarray(rewards)) / sizes
        assert [s.reward for s in stored] == rewards
        np.testing.assert_allclose(p, w / w.sum())
        drawn, _, _ = buf.sample(5000, 4, m=0.0, reward_inv_temp=1.3)
        counts = np.bincount([tokens.index(s.completion.tolist()) for s in drawn], minlength=4)
        assert all(within(c, 20000, pi) for c, pi in zip(counts, p))


def test_replay_report_splits_the_draw_mass_as_computed_by_hand():
    """benchmarks/replay_report.py on a saved buffer: reward bands by generating version, and the off-policy mass on
    top-reward samples with and without spreading (three near-copies of one top sample, one distinct top, one low),
    and the two draws' total variation distance."""
    buf = TBAReplayBuffer(seed=0, near_duplicate_jaccard=0.5)  # its own clusters are ignored by the report
    buf.add([sample(0, [1, 2, 3, 10 + i], reward=0.0, weights_version=i) for i in range(3)]
            + [sample(0, [40, 41], reward=0.0, weights_version=45), sample(0, [50, 51], reward=-3.0, weights_version=50)])
    r = replay_report.report(buf.get_state(), inv_temp=1.0, jaccard=0.4, top_reward=-1.0)
    low = np.exp(-3.0)
    assert r["samples"] == 5 and r["clusters_spread"] == 3 and r["clusters_prioritised"] == 0
    assert r["top_mass_prioritised"] == pytest.approx(4 / (4 + low))
    assert r["top_mass_spread"] == pytest.approx(2 / (2 + low))  # the copies' cluster counts once
    prioritised = [1 / (4 + low)] * 4 + [low / (4 + low)]
    spread = [1 / 3 / (2 + low)] * 3 + [1 / (2 + low), low / (2 + low)]
    assert r["tv_distance"] == pytest.approx(0.5 * sum(abs(p - q) for p, q in zip(prioritised, spread)))
    assert [(b["versions"], b["n"], b["top"]) for b in r["bands"]] == [([0, 39], 3, 3), ([40, 79], 2, 1)]
    assert "openings" not in r["bands"][0]
    # --openings: each band's first words, decoded with the run's tokenizer (here: token id -> word), "top" counted
    words = {1: "Bitch,", 2: "you", 3: "x", 40: "hey", 41: "Bitch", 50: "BITCH", 51: "no"}
    r = replay_report.report(buf.get_state(), inv_temp=1.0, jaccard=0.4, top_reward=-1.0,
                             decode=lambda ids: " ".join(words.get(int(i), "") for i in ids), openings=2)
    assert [b["openings"] for b in r["bands"]] == [[("bitch", 3, 3)], [("hey", 1, 1), ("bitch", 1, 0)]]
    # --fit-set: what smoothing at a bound would fit, decoded: the three top near-copies decode to one text
    from envs.metrics import embed

    f = replay_report.fit_set(buf.get_state(), -1.0, lambda ids: " ".join(words.get(int(i), "") for i in ids))
    assert (f["samples"], f["distinct"], f["openings"]) == (4, 2, [("bitch", 3, None), ("hey", 1, None)])
    a, b = embed(["Bitch, you x ", "hey Bitch"])
    assert f["diversity"] == pytest.approx((1 - float(a @ b)) / 2, abs=1e-5)  # 6 of 12 ordered pairs identical
    assert replay_report.fit_set(buf.get_state(), -3.0, lambda ids: "x")["samples"] == 5


def test_replay_cluster_cost_benchmark_runs(capsys):
    """benchmarks/replay_cluster_cost.py (docs/method.md §3 quotes it): one line per size, clusters counted."""
    replay_cluster_cost.main(["--samples", "300"])
    (line,) = capsys.readouterr().out.splitlines()
    assert line.split()[0] == "400" and 0 < int(line.split()[2]) <= 400 and "ms per added sample" in line
