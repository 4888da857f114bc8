"""tb_loss against independent computations (docs/method.md §1)."""

import numpy as np
import pytest
import torch

from rllib_tba.tb_loss import tb_loss


def numpy_vargrad(lp, lr, r, group, beta, tau=1.0):
    loss = 0.0
    for i in range(len(lp)):
        same = [j for j in range(len(lp)) if group[j] == group[i]]
        log_z = np.mean([(r[j] / beta + lr[j]) / tau - lp[j] for j in same])
        loss += (log_z + lp[i] - (lr[i] + r[i] / beta) / tau) ** 2
    return loss / len(lp)


@pytest.mark.parametrize("seed", range(5))
def test_matches_numpy_on_random_mixed_prompt_batches(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 40))
    group = rng.choice([3, 17, 42, 99], size=n)  # prompts interleaved, unequal group sizes
    lp, lr = rng.normal(-30, 8, n), rng.normal(-30, 8, n)
    r, beta = rng.normal(0, 1, n), float(rng.uniform(0.01, 1.0))
    got = tb_loss(*(torch.tensor(x) for x in (lp, lr, r, group)), beta)
    assert got.item() == pytest.approx(numpy_vargrad(lp, lr, r, group, beta), rel=1e-10)
    perm = rng.permutation(n)  # any layout gives the same loss
    permuted = tb_loss(*(torch.tensor(x[perm]) for x in (lp, lr, r, group)), beta)
    assert permuted.item() == pytest.approx(got.item(), rel=1e-10)


@pytest.mark.parametrize("tau", [0.5, 2.0])
def test_reward_temperature_tempers_the_whole_log_reward(tau):
    """Lee et al.'s reward temperature: log R = (r/beta + lr)/tau, so tau > 1 flattens the reward and the reference
    prior alike; with tau 1 the loss is the untempered one, and tempering by tau equals training at beta·tau against
    a reference whose log-probs are divided by tau."""
    rng = np.random.default_rng(7)
    n = 30
    group = rng.choice([0, 1, 2], size=n)
    lp, lr, r, beta = rng.normal(-30, 8, n), rng.normal(-30, 8, n), rng.normal(0, 1, n), 0.05
    t = lambda x: torch.tensor(x)  # noqa: E731
    got = tb_loss(t(lp), t(lr), t(r), t(group), beta, tau=tau).item()
    assert got == pytest.approx(numpy_vargrad(lp, lr, r, group, beta, tau), rel=1e-10)
    assert got == pytest.approx(tb_loss(t(lp), t(lr / tau), t(r), t(group), beta * tau).item(), rel=1e-10)
    assert got != pytest.approx(tb_loss(t(lp), t(lr), t(r), t(group), beta).item(), rel=1e-3)
    assert tb_loss(t(lp), t(lr), t(r), t(group), beta, tau=1.0).item() == \
        pytest.approx(numpy_vargrad(lp, lr, r, group, beta), rel=1e-10)


def test_gradient_equals_reinforce_with_per_prompt_mean_baseline():
    """On on-policy data, grad L = -(2/N) sum_ij (R_ij - mean_j R_ij) grad lp_ij with R = r/beta + lr - lp."""
    rng = np.random.default_rng(0)
    n_actions, n, beta = 6, 24, 0.3
    theta = torch.tensor(rng.normal(size=(2, n_actions)), requires_grad=True)  # one categorical policy per prompt
    ref = rng.normal(size=(2, n_actions))
    group = np.repeat([0, 1], n // 2)
    rng.shuffle(group)
    y = rng.integers(n_actions, size=n)
    r = rng.normal(size=n)
    lp = torch.log_softmax(theta, -1)[torch.tensor(group), torch.tensor(y)]
    lr = torch.log_softmax(torch.tensor(ref), -1)[torch.tensor(group), torch.tensor(y)]
    tb_loss(lp, lr, torch.tensor(r), torch.tensor(group), beta).backward()

    # independent REINFORCE gradient: grad log softmax(theta_g)[y] = onehot(y) - softmax(theta_g)
    probs = np.exp(theta.detach().numpy()) / np.exp(theta.detach().numpy()).sum(-1, keepdims=True)
    big_r = r / beta + lr.numpy() - lp.detach().numpy()
    expected = np.zeros_like(probs)
    for g in (0, 1):
        idx = np.flatnonzero(group == g)
        baseline = big_r[idx].mean()
        for j in idx:
            grad_lp = -probs[g].copy()
            grad_lp[y[j]] += 1
            expected[g] += -(2 / n) * (big_r[j] - baseline) * grad_lp
    np.testing.assert_allclose(theta.grad.numpy(), expected, rtol=1e-9, atol=1e-12)


def test_learned_log_z_variant():
    rng = np.random.default_rng(1)
    lp, lr, r = (torch.tensor(rng.normal(size=8)) for _ in range(3))
    log_z = torch.tensor(rng.normal(size=8), requires_grad=True)
    loss = tb_loss(lp, lr, r, torch.zeros(8, dtype=torch.long), 0.05, log_z)
    expected = ((log_z.detach() + lp - lr - r / 0.05) ** 2).mean()
    assert loss.item() == pytest.approx(expected.item())
    loss.backward()
    np.testing.assert_allclose(log_z.grad.numpy(), (2 / 8 * (log_z.detach() + lp - lr - r / 0.05)).numpy())


def test_vargrad_log_z_is_gradient_stopped():
    lp = torch.tensor([-1.0, -2.0, -3.0], requires_grad=True)
    loss = tb_loss(lp, torch.zeros(3), torch.zeros(3), torch.tensor([0, 0, 0]), 1.0)
    loss.backward()
    # d/dlp_i of mean((c + lp_i)^2) with c = -mean(lp) held fixed: 2/3 (lp_i - mean lp)
    np.testing.assert_allclose(lp.grad.numpy(), [2 / 3 * 1.0, 0.0, -2 / 3 * 1.0], atol=1e-7)
