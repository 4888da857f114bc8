"""What the `rllib` command shows a person: a progress table of what matters, library noise kept out of the console,
a learning-curve PNG, and before/after metric tables.

A tuned-example file may define ``progress_columns = {"result/key": "short name", ...}``; otherwise
``DEFAULT_COLUMNS`` are shown. Library logs (vLLM, Ray workers, transformers) go to Ray's session log files unless
``rllib train --verbose`` asks for them in the console.
"""

from __future__ import annotations

import csv
import logging
import os
from pathlib import Path

DEFAULT_COLUMNS = {
    "tba/weights_version": "updates",
    "env_runners/num_episodes_lifetime": "samples",
    "searchers/reward_mean": "reward",
    "tba/staleness_mean": "staleness",
}
X_AXIS = "tba/weights_version"  # learner updates: the same on every machine, unlike wall-clock
QUIET_ENV = {"VLLM_LOGGING_LEVEL": "ERROR", "TRANSFORMERS_VERBOSITY": "error", "PYTHONWARNINGS": "ignore",
             "TOKENIZERS_PARALLELISM": "false", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}


def quiet_libraries() -> dict:
    """Keep library chatter out of this process's console; returns env vars for Ray workers to do the same."""
    os.environ.update({k: v for k, v in QUIET_ENV.items() if k not in os.environ})
    import warnings

    warnings.filterwarnings("ignore")
    for name in ("ray", "ray.tune", "ray.rllib", "vllm", "transformers"):
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()  # "Loading weights" / "Writing model shards" bars
    except ImportError:
        pass
    return dict(QUIET_ENV)


def progress_reporter(columns: dict):
    """Tune's console table with ``columns`` (result key -> header) and no hyper-parameter columns, printed when a
    trial reports a new result or changes status (not every 30 s while nothing happens)."""
    from ray.tune import CLIReporter

    class OnNewResult(CLIReporter):
        _last = None

        def should_report(self, trials, done=False):
            state = tuple((t.trial_id, t.status, (t.last_result or {}).get("training_iteration")) for t in trials)
            if done or state != self._last:
                self._last = state
                return True
            return False

    return OnNewResult(metric_columns={"training_iteration": "iter", **columns}, parameter_columns=[],
                       max_report_frequency=5, print_intermediate_tables=True)


def learning_curve(trial_dir: str | Path, columns: dict, out: str | Path | None = None) -> Path | None:
    """Plot every numeric progress column against learner updates from the trial's progress.csv (all restarts of
    the trial included); returns the PNG path, or None when there is nothing to plot."""
    trial_dir = Path(trial_dir)
    table = trial_dir / "progress.csv"
    if not table.is_file():
        return None
    with open(table) as f:
        rows = list(csv.DictReader(f))
    keys = [k for k in columns if k != X_AXIS and rows and k in rows[0]]
    if not rows or not keys or X_AXIS not in rows[0]:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def number(text):
        try:
            return float(text)
        except (TypeError, ValueError):
            return float("nan")

    x = [number(r[X_AXIS]) for r in rows]
    fig, axes = plt.subplots(len(keys), 1, figsize=(6, 1.8 * len(keys)), sharex=True, squeeze=False)
    for ax, key in zip(axes[:, 0], keys):
        ax.plot(x, [number(r[key]) for r in rows], marker=".")
        ax.set_ylabel(columns[key])
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("learner updates")
    fig.suptitle(trial_dir.name, fontsize=8)
    fig.tight_layout()
    out = Path(out or trial_dir / "learning_curve.png")
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def final_values(result_metrics: dict, columns: dict) -> str:
    """One line: the last value of each progress column."""
    def get(key):
        value = result_metrics
        for part in key.split("/"):
            value = value.get(part) if isinstance(value, dict) else None
        return value

    parts = []
    for key, name in columns.items():
        value = get(key)
        if isinstance(value, (int, float)):
            parts.append(f"{name} {value:.4g}")
    return ", ".join(parts)


def comparison_table(before: dict, after: dict, keys=None) -> str:
    """A two-column table of the numeric metrics of the start and the trained policy."""
    keys = keys or [k for k, v in after.items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    width = max(len(k) for k in keys) if keys else 10
    lines = [f"{'metric':<{width}}  {'start':>10}  {'trained':>10}"]
    for key in keys:
        a, b = before.get(key), after.get(key)
        fmt = (lambda v: f"{v:>10.4g}" if isinstance(v, (int, float)) else f"{'-':>10}")
        lines.append(f"{key:<{width}}  {fmt(a)}  {fmt(b)}")
    return "\n".join(lines)
