"""The Ray executor's cluster: joining it (``connect``), its living nodes, and Ray's own errors
in one line (``ray_failure``).  Ray is imported lazily."""

from __future__ import annotations

import logging
import os
import signal
import threading

from prefixstudy.errors import UserError, first_line

NAMESPACE = "prefixstudy"


def connect(address: str, num_cpus: int | None = None) -> bool:
    """Join (or, for ``local``, start) the Ray cluster.  True when this call did so, and
    ``ray.shutdown()`` should undo it; False when Ray was already initialized here.

    ``local`` joins the cluster that RAY_ADDRESS names instead, when it is set: ``ray job submit``
    sets it for the job's entrypoint, whose engines belong on that cluster.
    """
    import ray

    if ray.is_initialized():
        return False
    if address == "local" and os.environ.get("RAY_ADDRESS"):
        address = os.environ["RAY_ADDRESS"]
    # Quiet unless -v: the actors' own output (vLLM's and torch's start-up notes, per engine) stays in
    # Ray's session logs, and Ray's notes (token authentication) stay out of the progress bar.  A
    # failing actor still reaches the results as a failed point with its cause.
    verbose = logging.getLogger().isEnabledFor(logging.INFO)
    quiet = dict(log_to_driver=verbose, logging_level=logging.WARNING if verbose else logging.ERROR)
    if address == "local":
        ray.init(address="local", num_cpus=num_cpus or os.cpu_count() or 1, include_dashboard=False, namespace=NAMESPACE,
                 **quiet)
    else:
        try:
            ray.init(address=address, namespace=NAMESPACE, **quiet)
        except ConnectionError as e:
            raise UserError(f"ray.address '{address}': cannot reach a Ray cluster ({e})") from None
    _keep_sigterm_handler()
    return True


def _keep_sigterm_handler() -> None:
    """ray.init installs Ray's own failure-signal handler over ours: on 2 x H200 a SIGTERM (a
    deadline's `timeout`) then killed the driver at once, leaving the manifest at "running" with
    no summary of the points it had saved.  Put the study's handler back (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        return
    handler = signal.getsignal(signal.SIGTERM)
    if callable(handler):
        signal.signal(signal.SIGTERM, handler)


def ray_failure(e: BaseException) -> str:
    """A Ray error that is no task's or actor's own (Ray's OutOfMemoryError, a lost object, a
    cluster going away), in one line with what to do."""
    what = ("run fewer engines side by side (--parallel off, or fewer replicas) or --executor local"
            if type(e).__name__ == "OutOfMemoryError" else "try again, or run with --executor local")
    return f"Ray: {type(e).__name__}: {first_line(e, 200)}; {what}"


def alive_nodes() -> list[dict]:
    import ray

    return [n["Resources"] for n in ray.nodes() if n.get("Alive")]


def alive_node_ids() -> list[str]:
    """The node ids of ``alive_nodes()``, in the same order."""
    import ray

    return [n["NodeID"] for n in ray.nodes() if n.get("Alive")]
