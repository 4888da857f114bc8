"""Scale-out on Ray: several DDP learners, several searchers, a local multi-node cluster, the GPU recipe's resources."""

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import ray
from ray.rllib.core import DEFAULT_MODULE_ID

from conftest import TUNED_EXAMPLES
from tba_tiny import tiny_config

from rllib_tba import TBA


def learner_weights(algo) -> list[dict]:
    """Every learner's module weights (one dict per learner; the local learner when num_learners=0)."""
    def weights(learner):
        module = learner.module[DEFAULT_MODULE_ID].unwrapped()
        return {k: v.detach().cpu().numpy().copy() for k, v in module.state_dict().items()}

    if algo.config.num_learners == 0:
        return [weights(algo.learner_group._learner)]
    return [r.get() for r in algo.learner_group.foreach_learner(weights)]


def test_two_ddp_learners_equal_one_learner_on_the_same_batches(ray_session):
    """2 DDP learners (gloo on CPU), each given half of the batch's prompt groups, hold identical weights after every
    update, and those weights are the ones a single learner reaches on the same batches. Tolerance: the two paths
    sum the same float32 gradients in a different order (DDP averages two half-batch means), so they agree to float32
    rounding, which AdamW can magnify for a weight whose gradient is ~0 (its step is ~lr whatever the gradient's
    size). Measured: at most 1.2e-7 after 3 updates that moved weights by up to 3e-3; we allow 1e-5, 100x below
    one step (lr = 1e-3), so any real difference in the update (a cut group, a wrong average) fails."""
    training = dict(async_mode=False, prompts_per_batch=4, num_samples_per_prompt=4, generations_per_prompt=4,
                    prompts_per_generation=4, lr=1e-3, learn_log_z=False, max_new_tokens=8)
    one = tiny_config(num_env_runners=0, **training).build_algo()
    two = tiny_config(num_env_runners=0, **training).learners(num_learners=2, num_cpus_per_learner=1).build_algo()
    try:
        start = learner_weights(one)[0]
        for w in learner_weights(two):
            for k in start:
                np.testing.assert_array_equal(w[k], start[k])
        for _ in range(3):
            samples = TBA.batch_to_samples(one.env_runner.generate().without_infos())[:16]
            one.learn_on(samples)
            two.learn_on(samples)
            w1, (a, b) = learner_weights(one)[0], learner_weights(two)
            moved = max(float(np.abs(w1[k] - start[k]).max()) for k in w1)
            assert moved > 1e-4  # the update did something
            worst = max(float(np.abs(a[k] - w1[k]).max()) for k in w1)
            print(f"update {two.weights_version}: largest |w(2 learners) - w(1 learner)| = {worst:.2e}, "
                  f"largest weight change {moved:.2e}")
            for k in w1:
                np.testing.assert_array_equal(a[k], b[k])  # DDP learners never drift apart
            assert worst <= 1e-5
        assert two.weights_version == one.weights_version == 3
    finally:
        one.stop()
        two.stop()


def test_two_learners_train_checkpoint_and_restore(ray_session, tmp_path):
    """The full loop with 2 learners and the learned-logZ head (under DDP too): a batch whose prompt-group count does
    not divide is refused up front; weights stay identical; a checkpoint restores into 2 learners."""
    with pytest.raises(ValueError, match=r"prompts_per_batch \(B=3\) must be a multiple of num_learners \(2\)"):
        tiny_config(prompts_per_batch=3).learners(num_learners=2).validate()
    config = tiny_config(num_env_runners=0, async_mode=False, learn_log_z=True, prompts_per_batch=2,
                         beta_schedule=[[0, 0.2], [4, 0.1]], updates_per_iteration=2).learners(
        num_learners=2, num_cpus_per_learner=1)
    algo = config.build_algo()
    try:
        for _ in range(2):
            result = algo.train()
        assert algo.weights_version == 4 and np.isfinite(result["learners"]["default_policy"]["tb_loss"])
        # beta at updates 2 and 3 (the iteration's mean): the schedule reaches every learner
        assert result["learners"]["default_policy"]["beta"] == pytest.approx((0.15 + 0.125) / 2)
        a, b = learner_weights(algo)
        assert any("log_z" in k for k in a)
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])
        path = algo.save_to_path(str(tmp_path / "ckpt"))
    finally:
        algo.stop()
    restored = TBA.from_checkpoint(path)
    try:
        assert restored.weights_version == 4
        for w in learner_weights(restored):
            for k in a:
                np.testing.assert_array_equal(w[k], a[k])
        restored.train()
        assert restored.weights_version == 6
    finally:
        restored.stop()


def test_two_searchers_both_sample_and_get_every_version_sent(ray_session, monkeypatch):
    """2 searchers: both contribute samples, each loads exactly the weight versions sent to it, in order (one
    object-store copy per version, fire-and-forget; a searcher whose previous weights request is still queued gets
    the newest version once that one is done), and results report throughput and staleness per searcher."""
    from rllib_tba.vllm_env_runner import WEIGHTS_VERSION

    put_versions, real_put = [], ray.put

    def counting_put(value, *args, **kwargs):  # which weight versions the driver puts in the object store
        if isinstance(value, dict) and WEIGHTS_VERSION in value:
            put_versions.append(value[WEIGHTS_VERSION])
        return real_put(value, *args, **kwargs)

    monkeypatch.setattr(ray, "put", counting_put)
    config = tiny_config(num_env_runners=2, sync_every=1, updates_per_iteration=3, training_intensity=2.0,
                         prompts_per_generation=2, generations_per_prompt=4)
    algo = config.build_algo()
    try:
        for _ in range(4):
            result = algo.train()
        per = result["searchers"]["per_searcher"]
        assert set(per) == {"1", "2"}, per
        for who in per.values():
            assert who["samples"] > 0 and who["tokens_per_s"] > 0 and who["arrival_staleness_mean"] >= 0
        deadline = time.time() + 60  # let the last fire-and-forget loads land
        while algo._weights_in_flight and time.time() < deadline:
            algo._fetch_samples(timeout_s=0.5)
        loaded = dict(zip((1, 2), algo.env_runner_group.foreach_env_runner(lambda r: list(r.versions_loaded),
                                                                          local_env_runner=False)))
        for i in (1, 2):  # a searcher loads a sync after the calls queued before it: some versions are skipped
            sent = algo.versions_sent(i)
            assert sent and sent[-1] > 0 and sent == sorted(sent), sent
            assert loaded[i][-len(sent):] == sent, (i, loaded[i], sent)
        # one object-store copy per version, whatever the number of searchers it went to
        assert len(put_versions) == len(set(put_versions)) == len(set(algo.versions_sent(1) + algo.versions_sent(2)))
    finally:
        algo.stop()



def pull_config(pull: bool):
    """Two searchers with four generation calls queued each and a sync after every update: a weights request waits
    behind four calls unless the searchers pull the newest sync at each call's start."""
    return (tiny_config(num_env_runners=2, sync_every=1, updates_per_iteration=3, training_intensity=2.0,
                        prompts_per_generation=2, generations_per_prompt=4, pull_weights=pull)
            .env_runners(max_requests_in_flight_per_env_runner=5))


def test_pulled_weights_reach_generation_sooner_and_never_go_back(ray_session):
    """pull_weights: each generation call starts with the newest synced weights (from the WeightsBoard actor); a
    searcher never loads an older version afterwards (the driver's own weights requests skip what it already has),
    and what the searchers generate arrives less stale than when syncs wait behind the queued calls."""
    staleness = {}
    for pull in (False, True):
        algo = pull_config(pull).build_algo()
        try:
            for _ in range(6):
                result = algo.train()
            per = result["searchers"]["per_searcher"]
            staleness[pull] = np.mean([who["arrival_staleness_mean"] for who in per.values()])
            loaded = algo.env_runner_group.foreach_env_runner(lambda r: (list(r.versions_loaded), r.weights_pulled),
                                                              local_env_runner=False)
            for versions, pulled in loaded:
                assert versions == sorted(set(versions)), versions  # strictly newer each time
                assert (pulled > 0) == pull, (pull, pulled)
        finally:
            algo.stop()
    assert staleness[True] < 0.75 * staleness[False], staleness


def test_a_restore_is_not_undone_by_the_board_s_newer_weights(ray_session, tmp_path):
    """Restoring an earlier checkpoint into a running algorithm puts its (lower) version on the board too: the
    searchers' next calls must not pull the weights trained after the checkpoint."""
    algo = pull_config(True).build_algo()
    try:
        algo.train()
        path = algo.save_to_path(str(tmp_path / "ckpt"))
        saved = algo.weights_version
        for _ in range(4):
            algo.train()
        assert algo.weights_version >= saved + 12
        algo.restore_from_path(path)
        assert algo.weights_version == saved
        algo.train()
        versions = algo.env_runner_group.foreach_env_runner(lambda r: r.weights_version, local_env_runner=False)
        assert versions and max(versions) <= algo.weights_version == saved + 3, (versions, algo.weights_version)
    finally:
        algo.stop()


MULTI_NODE = r"""
import json, sys
import ray
from ray.cluster_utils import Cluster
sys.path.insert(0, sys.argv[1])
from tba_tiny import tiny_config

cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"learner_node": 1}})
searcher_node = cluster.add_node(num_cpus=2, resources={"searcher_node": 2})
ray.init(address=cluster.address, log_to_driver=False)
config = (tiny_config(num_env_runners=2, updates_per_iteration=2, training_intensity=4.0)
          .env_runners(num_env_runners=2, num_cpus_per_env_runner=1,
                       custom_resources_per_env_runner={"searcher_node": 1})
          .learners(num_learners=1, num_cpus_per_learner=1, custom_resources_per_learner={"learner_node": 1}))
algo = config.build_algo()
results = [algo.train() for _ in range(3)]
node = lambda *_: ray.get_runtime_context().get_node_id()
out = {"searcher_nodes": algo.env_runner_group.foreach_env_runner(node, local_env_runner=False),
       "learner_nodes": [r.get() for r in algo.learner_group.foreach_learner(node)],
       "head": cluster.head_node.node_id, "worker": searcher_node.node_id,
       "nodes_alive": sum(n["Alive"] for n in ray.nodes()),
       "weights_version": algo.weights_version, "samples": results[-1]["tba"]["samples_received"],
       "searcher_versions": algo.env_runner_group.foreach_env_runner(lambda r: r.weights_version,
                                                                     local_env_runner=False)}
algo.stop()
ray.shutdown()
cluster.shutdown()
print("RESULT " + json.dumps(out))
"""


def test_multi_node_cluster_searchers_and_learner_on_their_nodes(tiny_model):
    """A real 2-node Ray cluster on this machine (ray.cluster_utils.Cluster, two raylets): custom resources pin both
    searchers to one node and the learner actor to the other; TBA trains end to end across them."""
    env = {**os.environ, "RAY_ADDRESS": ""}
    proc = subprocess.run([sys.executable, "-c", MULTI_NODE, str(TUNED_EXAMPLES)], capture_output=True, text=True,
                          timeout=600, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-5000:]
    out = json.loads(lines[-1][len("RESULT "):])
    assert out["nodes_alive"] == 2 and out["head"] != out["worker"]
    assert out["searcher_nodes"] == [out["worker"]] * 2
    assert out["learner_nodes"] == [out["head"]]
    assert out["weights_version"] == 6 and out["samples"] > 0
    assert all(v > 0 for v in out["searcher_versions"])  # weights crossed from the learner's node to the searchers'


def test_gpu_recipe_builds_and_its_resources_add_up():
    """tuned_examples/tba_gsm8k_gpu.py on 1 node x 8 GPUs (4 searchers + 4 learners) and 2 nodes (6 + 10): the config
    validates, and the resources Tune reserves for the trial add up to the GPUs."""
    import importlib.util

    def load(**env):
        old = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            spec = importlib.util.spec_from_file_location("gpu_recipe", TUNED_EXAMPLES / "tba_gsm8k_gpu.py")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module
        finally:
            for k, v in old.items():
                os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)

    for searchers, learners, gpus in ((4, 4, 8), (8, 8, 16)):
        module = load(TBA_SEARCHERS=str(searchers), TBA_LEARNERS=str(learners))
        config = module.config
        config.validate()
        assert config.prompts_per_batch % config.num_learners == 0
        assert config.policy_model == "realtreetune/rho-1b-sft-GSM8K" and module.stop == {"tba/weights_version": 1000}
        bundles = TBA.default_resource_request(config).bundles
        assert sum(b.get("GPU", 0) for b in bundles) == gpus, bundles
    with pytest.raises(ValueError, match="must be a multiple of num_learners"):
        load(TBA_SEARCHERS="5", TBA_LEARNERS="3").config.validate()
