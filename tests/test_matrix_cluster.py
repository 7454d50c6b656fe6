"""``hfexport matrix --cluster ADDRESS``: the cases run on the workers of an existing Dask cluster (here a
LocalCluster of worker processes, as ``dask worker`` starts them on other machines), with the same command, the
same rows and the same record as a local run (``tests/test_matrix.py`` checks the local run's rows the same way)."""

from __future__ import annotations

import csv
import json
import sys

import pytest

from hfexport import MissingPackageError
from hfexport.cli import main

distributed = pytest.importorskip("distributed", reason="the matrix's --cluster needs dask's distributed package "
                                                        "(pip install 'hfexport[distributed]')")


@pytest.fixture(scope="module")
def cluster_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("matrix-cluster")
    with distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=True, dashboard_address=None) as cluster:
        code = main(["matrix", "--backends", "dynamo", "no-such-backend", "--families", "=llama", "--stages",
                     "export", "--timeout", "240", "--no-png", "--cluster", cluster.scheduler_address,
                     "--out", str(out)])
        yield code, out, cluster.scheduler_address, {w.worker_address for w in cluster.workers.values()}


def _record(out):
    return [json.loads(line) for line in (out / "support-matrix.jsonl").read_text().splitlines()]


def test_the_cases_run_on_the_clusters_workers_and_give_a_local_runs_rows(cluster_run):
    code, out, address, workers = cluster_run
    assert code == 0
    ran = [r.get("worker") for r in _record(out) if "model_type" in r]
    assert len(ran) == 2 and set(ran) <= workers, (ran, workers)  # each case ran on a worker of the cluster
    with (out / "support-matrix.csv").open() as f:
        rows = {r["backend"]: r for r in csv.DictReader(f)}
    ok, bad = rows["dynamo"], rows["no-such-backend"]
    assert (ok["model_type"], ok["class_name"], ok["status"]) == ("llama", "LlamaForCausalLM", "pass")
    assert 0.0 <= float(ok["max_abs_diff"]) <= 1e-4 and float(ok["export_seconds"]) > 0
    assert bad["status"] == "fail" and bad["reason"].startswith("ConfigError") and "no-such-backend" in bad["reason"]


def test_the_record_names_the_cluster_and_the_command_that_reruns_it(cluster_run):
    _, out, address, _ = cluster_run
    header = next(r["run"] for r in _record(out) if "run" in r)
    assert header["cluster"] == address and f"--cluster {address}" in header["command"]
    assert header["jobs"] == 2  # --jobs left at its default: the cluster's threads


def test_a_cluster_run_without_distributed_names_the_pip_line(monkeypatch, tmp_path, capsys):
    from hfexport.tools.matrix.cluster import connect

    monkeypatch.setitem(sys.modules, "distributed", None)
    with pytest.raises(MissingPackageError, match="pip install 'dask==.*' 'distributed==.*'"):
        connect("tcp://127.0.0.1:1")
    code = main(["matrix", "--backends", "dynamo", "--families", "=llama", "--cluster", "tcp://127.0.0.1:1",
                 "--out", str(tmp_path)])
    assert code != 0 and "pip install 'dask==" in capsys.readouterr().err
    assert not (tmp_path / "support-matrix.jsonl").exists()  # refused before any run is recorded
