"""Starting a local Ray for the ``rllib`` command: loopback only, checked resources, clean shutdown on SIGTERM.

- :func:`init_local_ray` starts Ray on this machine without its dashboard (no web UI listening), unless a cluster
  is named (``RAY_ADDRESS``). What we serve (``rllib serve``) binds to 127.0.0.1 by default. Ray 2.60's own gRPC
  servers (GCS, raylet, workers) listen on all interfaces whatever ``ray.init`` is given — it maps 127.0.0.1 to
  the node's IP — and rely on Ray's token authentication (on by default in this version).
- :func:`check_cluster_fits` says up front when an algorithm needs more CPUs than Ray has (Tune would leave the trial
  PENDING forever).
- :func:`sigterm_as_keyboard_interrupt` makes SIGTERM (``kill``, systemd, Kubernetes) take Ctrl-C's clean path;
  :func:`stop_on_signals` and :func:`wait_for_stop` do the same for a server that blocks until it is told to stop.
"""

from __future__ import annotations

import os
import signal
import threading

def init_local_ray(num_cpus: int | None = None, **kwargs) -> None:
    import ray

    if ray.is_initialized():
        return
    if os.environ.get("RAY_ADDRESS"):  # an existing cluster: join it as it is
        ray.init(**kwargs)
        return
    ray.init(num_cpus=num_cpus, include_dashboard=False, **kwargs)


def check_cluster_fits(config) -> None:
    """Raise ``SystemExit`` naming the numbers when ``config``'s algorithm needs more CPUs/GPUs than Ray has."""
    import ray

    request = config.algo_class.default_resource_request(config)
    bundles = getattr(request, "bundles", None) or [getattr(request, "required_resources", {})]
    available = ray.cluster_resources()
    for resource in ("CPU", "GPU"):
        need = sum(float(b.get(resource, 0)) for b in bundles)
        have = float(available.get(resource, 0))
        if need > have:
            raise SystemExit(
                f"rllib train: the run needs {need:g} {resource}(s) (learner + {config.num_env_runners} env runner(s) x "
                f"{config.num_cpus_per_env_runner if resource == 'CPU' else config.num_gpus_per_env_runner:g}) "
                f"but Ray has {have:g}; raise --num-cpus or lower --num-env-runners")


def sigterm_as_keyboard_interrupt() -> None:
    """SIGTERM raises KeyboardInterrupt in the main thread, so ``finally:`` blocks shut Serve/Ray down cleanly."""
    stop_on_signals((signal.SIGTERM,))


def stop_on_signals(signals=(signal.SIGINT, signal.SIGTERM)) -> threading.Event:
    """Each of ``signals`` (default: Ctrl-C and SIGTERM) raises KeyboardInterrupt in the main thread and sets the
    returned event, which stays set where Ray code caught the KeyboardInterrupt. Call after ``ray.init``, which
    installs a SIGTERM handler."""
    stopping = threading.Event()

    def handler(signum, frame):
        stopping.set()
        raise KeyboardInterrupt(f"signal {signum}")

    for sig in signals:
        signal.signal(sig, handler)
    return stopping


def wait_for_stop(stopping: threading.Event, poll_s: float = 1.0) -> None:
    """Block until a signal of :func:`stop_on_signals`, then raise KeyboardInterrupt. In short waits: the kernel
    may hand a process's signal to any thread that does not block it (Ray's and gRPC's threads), and Python runs
    the handler only when the main thread next runs Python code, so one long ``time.sleep`` kept a stopped server
    up (``rllib serve`` once ignored SIGINT for 5 min in a test)."""
    while not stopping.wait(poll_s):
        pass
    raise KeyboardInterrupt("stopped by a signal")
