"""The Spark engine on a real cluster: a standalone master and two workers on localhost, started here from the
pyspark package (each worker with its own work directory), and a default file system that is not the driver's
disk (``viewfs``, its mount table pointing elsewhere), so that a release that assumed a POSIX path shared by the
driver and the executors would fail or write to the wrong place."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from hdmm.cli import main

pytest.importorskip("pyspark")

pytestmark = pytest.mark.slow  # a cluster of three JVMs: skip locally with -m "not slow"; CI runs it

HERE = Path(__file__).parent


def _spark_home() -> str:
    import pyspark

    return os.path.dirname(pyspark.__file__)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(args: list[str], log: Path) -> subprocess.Popen:
    env = {**os.environ, "SPARK_HOME": _spark_home(), "SPARK_LOCAL_IP": "127.0.0.1"}
    with open(log, "w") as out:
        return subprocess.Popen([os.path.join(_spark_home(), "bin", "spark-class"), *args], stdout=out,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """``spark://127.0.0.1:PORT``: a standalone master and two workers (one core, 1 GB each)."""
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Java is needed for a Spark cluster")
    root = tmp_path_factory.mktemp("cluster")
    port, ui = _free_port(), _free_port()
    processes = [_start(["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
                         "--webui-port", str(ui)], root / "master.log")]
    master = f"spark://127.0.0.1:{port}"
    try:
        for k in (1, 2):
            (root / f"worker{k}").mkdir()
            processes.append(_start(["org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--cores", "1",
                                     "--memory", "1g", "--work-dir", str(root / f"worker{k}"), "--webui-port", "0",
                                     master], root / f"worker{k}.log"))
        deadline = time.time() + 90
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=2) as response:
                    alive = [w for w in json.load(response)["workers"] if w["state"] == "ALIVE"]
                if len(alive) == 2:
                    break
            except OSError:
                pass
            if time.time() > deadline:
                raise RuntimeError("the standalone cluster did not start: " + (root / "master.log").read_text()[-2000:])
            time.sleep(0.5)
        yield master, root
    finally:
        for p in processes:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in processes:
            p.wait(timeout=30)


def test_the_cli_submitted_to_a_standalone_cluster_reads_and_writes_through_the_default_file_system(cluster,
                                                                                                   tmp_path):
    """``spark-submit --master spark://... hdmm/__main__.py release --engine spark`` runs on that master (not local[2]), and
    the paths it is given (records in, release out) are resolved by Spark's default file system (viewfs here,
    mounted on a directory the command never names): nothing is written at those paths on the driver's disk, no
    work file is left, and the release equals the local engine's."""
    from cli_files import geography_release_args, write_geography_files

    master, _ = cluster
    files = write_geography_files(tmp_path)
    store = tmp_path / "store"  # what viewfs:/hdmm-test-<pid>/... is on this machine
    (store / "in").mkdir(parents=True)
    (files / "people.parquet").rename(store / "in" / "people.parquet")
    mount = f"/hdmm-test-{os.getpid()}"  # a path that does not exist on the driver's disk
    import hdmm.__main__ as hdmm_cli  # the command line as a script spark-submit runs (README)

    more = ("--postprocess", "integer", "--invariants", "state")
    command = [os.path.join(_spark_home(), "bin", "spark-submit"), "--master", master,
               "--conf", "spark.hadoop.fs.defaultFS=viewfs://hdmm/",
               "--conf", f"spark.hadoop.fs.viewfs.mounttable.hdmm.link.{mount}=file://{store}",
               "--conf", f"spark.pyspark.python={sys.executable}", "--conf", "spark.executor.memory=768m",
               "--conf", "spark.sql.shuffle.partitions=4", "--conf", "spark.ui.enabled=false", hdmm_cli.__file__,
               *geography_release_args(files, "--data", f"{mount}/in/people.parquet", "--engine", "spark",
                                       "--output", f"{mount}/out", *more)]
    env = {**os.environ, "SPARK_HOME": _spark_home(), "PYSPARK_PYTHON": sys.executable}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert f"to viewfs://hdmm{mount}/out (Parquet" in done.stdout
    assert not os.path.exists(mount)  # nothing at the command's paths on the driver's own disk
    assert sorted(p.name for p in store.iterdir()) == ["in", "out"]  # no work files, no partial directory left
    meta = json.loads((store / "out" / "_provenance.json").read_text())
    assert meta["seeded"] is True and meta["data"]["source"] == f"viewfs://hdmm{mount}/in/people.parquet"
    root = cluster[1]
    assert all(any((root / f"worker{k}").glob("app-*")) for k in (1, 2))  # an executor in each worker's directory

    (store / "in" / "people.parquet").rename(files / "people.parquet")
    assert main(geography_release_args(files, "--data", str(files / "people.parquet"), "--output",
                                       str(files / "local"), *more)) == 0
    for level in ("state", "county"):
        cluster_rows = _level_rows(store / "out" / f"level={level}")
        local_rows = _level_rows(files / "local" / f"level={level}")
        np.testing.assert_array_equal(cluster_rows["answer"].to_numpy(), local_rows["answer"].to_numpy())


def _level_rows(directory) -> pd.DataFrame:
    rows = pd.read_parquet(directory)
    return rows.astype({"code": str, "query": str}).sort_values(["code", "query"])


def _wait_for_port(port: int, process: subprocess.Popen, log: Path, seconds: float = 120) -> None:
    deadline = time.time() + seconds
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            if process.poll() is not None or time.time() > deadline:
                raise RuntimeError("the Spark Connect server did not start: " + log.read_text()[-3000:]) from None
            time.sleep(0.5)


def test_the_cli_on_a_spark_connect_server_gives_the_local_release(cluster, tmp_path):
    """A Spark Connect server (started from the pyspark package, its executors on the standalone cluster) runs a
    release for a client that has no SparkContext, no RDDs and no JVM (``SPARK_REMOTE``): the answers equal the
    local engine's, and the release is written whole, in one job, with its provenance."""
    from cli_files import geography_release_args, write_geography_files

    master, root = cluster
    files = write_geography_files(tmp_path)
    port = _free_port()
    log = root / "connect.log"
    env = {**os.environ, "SPARK_HOME": _spark_home(), "SPARK_LOCAL_IP": "127.0.0.1"}
    with open(log, "w") as out:
        server = subprocess.Popen(
            [os.path.join(_spark_home(), "bin", "spark-submit"), "--class",
             "org.apache.spark.sql.connect.service.SparkConnectServer", "--master", master,
             "--conf", f"spark.connect.grpc.binding.port={port}", "--conf", f"spark.pyspark.python={sys.executable}",
             "--conf", "spark.executor.memory=768m", "--conf", "spark.sql.shuffle.partitions=4",
             "--conf", "spark.ui.enabled=false", "--conf", "spark.io.encryption.enabled=true", "spark-internal"],
            stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        _wait_for_port(port, server, log)
        more = ("--data", str(files / "people.parquet"), "--postprocess", "integer")
        client = {**os.environ, "SPARK_REMOTE": f"sc://127.0.0.1:{port}"}
        client.pop("SPARK_HOME", None)
        done = subprocess.run([sys.executable, "-m", "hdmm", *geography_release_args(
            files, *more, "--engine", "spark", "--output", str(files / "connect"))], capture_output=True, text=True,
            env=client, timeout=600)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)
    assert main(geography_release_args(files, *more, "--output", str(files / "local"))) == 0
    for level in ("state", "county"):
        np.testing.assert_array_equal(_level_rows(files / "connect" / f"level={level}")["answer"].to_numpy(),
                                      _level_rows(files / "local" / f"level={level}")["answer"].to_numpy())
    provenance = [json.loads(line) for p in (files / "connect" / "_provenance.json").glob("part-*")
                  for line in p.read_text().splitlines()]
    assert len(provenance) == 1 and provenance[0]["seeded"] is True
