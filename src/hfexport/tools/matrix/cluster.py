"""Matrix cases on an existing Dask cluster: ``hfexport matrix --cluster tcp://SCHEDULER:8786``.

A run that outgrows one machine sends each case to a worker of a Dask cluster the user already runs (``dask
scheduler`` + ``dask worker`` on each machine, or any deployment of ``distributed``: Kubernetes, SLURM, YARN). Nothing
of the scheduling is ours: the case is one ``Client.submit`` of :func:`run_case_on_worker`, and Dask places it,
retries it once when a worker dies (``retries``), and returns its row (which names the worker that ran it). The case still runs in a process of its own on the
worker, with its timeout (:mod:`.launch`): a crash or a hang ends that process, not the worker. The local loop around
it (:func:`~.scheduler.run_matrix`) is the same as for a local run: the same rows, the same shared ``cannot-build``
rows, the same record written as each row arrives, ``--resume`` alike.

Every worker needs the same environment as the machine that starts the run (hfexport and the backends of the run, at
the versions ``hfexport env`` prints); a worker that lacks a backend gives that backend's ``unavailable`` rows.
"""

from __future__ import annotations

import multiprocessing
import os
from typing import Any

from ..._versions import pip_line
from ...errors import MissingPackageError

__all__ = ["DaskCluster", "connect", "run_case_on_worker"]


def connect(address: str) -> DaskCluster:
    """A client of the Dask scheduler at ``address`` (``tcp://host:8786``), or :class:`MissingPackageError` naming
    the pip line when ``distributed`` is not installed."""
    try:
        from distributed import Client
    except ImportError:
        raise MissingPackageError("distributed", "hfexport matrix --cluster",
                                  pip_line(["dask", "distributed"])) from None
    return DaskCluster(Client(address, set_as_default=False, timeout="30s"))


class DaskCluster:
    """Runs one function call on the cluster and waits for its result (from the local loop's threads)."""

    def __init__(self, client: Any):
        self.client = client

    @property
    def address(self) -> str:
        return str(self.client.scheduler.address)

    def slots(self) -> int:
        """Cases the cluster runs at once: its workers' threads added up."""
        return max(1, sum(self.client.nthreads().values()))

    def run(self, fn: Any, *args: Any) -> Any:
        # pure=False: two calls with equal arguments are two cases, never one cached result
        return self.client.submit(fn, *args, pure=False, retries=1).result()

    def close(self) -> None:
        self.client.close()


def run_case_on_worker(run_one: Any, case: Any, timeout: float, launcher: str, backends: tuple[str, ...]) -> Any:
    """On the worker: one case in its own process, with the worker's cores shared among the worker's threads (each
    may run a case at once). A Dask worker process is daemonic, and a daemonic process may not start
    ``multiprocessing`` children: its cases start with ``exec`` (a fresh interpreter) instead of the forkserver."""
    from distributed import get_worker

    worker = get_worker()
    threads = max(1, (os.cpu_count() or 1) // max(1, worker.state.nthreads))
    if multiprocessing.current_process().daemon:
        launcher = "exec"
    row = run_one(case, timeout, launcher, backends, threads)
    return {**row, "worker": str(worker.address)}  # where it ran, in the record
