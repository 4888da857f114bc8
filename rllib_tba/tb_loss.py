"""The trajectory-balance loss of TBA (docs/method.md §1), one pure function."""

from __future__ import annotations

import torch


def tb_loss(logp: torch.Tensor, ref_logp: torch.Tensor, reward: torch.Tensor, group: torch.Tensor, beta: float,
            log_z: torch.Tensor | None = None, tau: float = 1.0) -> torch.Tensor:
    """Trajectory balance towards  pi*(y|x) ∝ [pi_ref(y|x) · exp(r(x,y) / beta)]^(1/tau).

    For samples j of prompt i (all tensors shape (N,), one entry per sample, any order/layout):

        lp_ij  = logp      (sum of log pi_theta over the response tokens)
        lr_ij  = ref_logp  (the same sum under the frozen reference model)
        r_ij   = reward
        logR_ij = ( r_ij/beta + lr_ij ) / tau                         (tau = 1: the target above, untempered)
        logZ_i  = mean_{j in group i} [ logR_ij - lp_ij ]             (VarGrad, gradient stopped)   if log_z is None
                = log_z_ij                                            (a learned per-sample logZ(x))  otherwise
        L       = mean_ij ( logZ_i + lp_ij - logR_ij )²

    ``group`` holds a prompt id per sample; logZ_i averages over exactly the samples that share it, whatever the
    batch layout. ``beta`` is applied here, at train time (store r, never r/beta). ``tau`` is Lee et al.'s reward
    temperature (their red-team variant tempers log R by 1/tau, tau 2 -> 1 early in training).
    """
    target = (reward / beta + ref_logp) / tau  # log of the unnormalised target density
    if log_z is None:
        _, index = torch.unique(group, return_inverse=True)
        residual = (target - logp).detach()
        sums = torch.zeros(int(index.max()) + 1, dtype=residual.dtype,
                           device=residual.device).index_add_(0, index, residual)
        counts = torch.bincount(index).to(residual.dtype)
        log_z = (sums / counts)[index]
    return ((log_z + logp - target) ** 2).mean()
