"""Which Spark master a geography release runs on: the caller's, Spark's own configuration's, else local[2]."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hdmm.georelease.session import DEFAULT_MASTER, configured_master


def test_the_master_spark_is_configured_with_is_found(tmp_path):
    assert not configured_master({})
    assert configured_master({"PYSPARK_GATEWAY_PORT": "41234"})  # inside spark-submit or a pyspark shell
    assert configured_master({"MASTER": "local[3]"})
    assert configured_master({"PYSPARK_SUBMIT_ARGS": "--master yarn --deploy-mode client pyspark-shell"})
    assert not configured_master({"PYSPARK_SUBMIT_ARGS": "--driver-memory 2g pyspark-shell"})
    conf = tmp_path / "conf"
    conf.mkdir()
    assert not configured_master({"SPARK_CONF_DIR": str(conf)})
    (conf / "spark-defaults.conf").write_text("# spark.master local[9]\nspark.executor.memory 2g\n")
    assert not configured_master({"SPARK_CONF_DIR": str(conf)})  # a comment does not count
    (conf / "spark-defaults.conf").write_text("spark.executor.memory 2g\nspark.master   spark://head:7077\n")
    assert configured_master({"SPARK_CONF_DIR": str(conf)})
    assert configured_master({"SPARK_HOME": str(tmp_path)})  # SPARK_HOME/conf
    assert DEFAULT_MASTER == "local[2]"


def test_the_cli_takes_a_master_only_for_spark(tmp_path, capsys):
    from cli_files import fails

    for extra, message in [([], "only apply to a geography release"),
                           (["--geography", "state"], "--master is the Spark master: add --engine spark")]:
        error = fails(["release", "--workload", "sf1", "--epsilon", "1", "--people", "1000", "--master", "local[1]",
                       *extra, "--output", str(tmp_path / "o")], capsys)
        assert message in error


pytest.importorskip("pyspark")

SCRIPT = textwrap.dedent("""
    import sys
    import pandas as pd
    from hdmm.georelease.session import spark_session
    spark = spark_session(*sys.argv[1:])
    print("MASTER", spark.sparkContext.master)
    frame = spark.createDataFrame(pd.DataFrame({"g": [0, 1, 1], "x": [1.0, 2.0, 3.0]}))  # pandas in both places
    print("ROWS", frame.groupBy("g").applyInPandas(lambda t: t.head(1), frame.schema).count())
    spark.stop()
""")


def _master(tmp_path: Path, command: list[str], env: dict[str, str], *args: str) -> str:
    """The master of a session made by ``spark_session(*args)`` in a new process started by ``command``."""
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    clean = {k: v for k, v in os.environ.items() if k not in ("MASTER", "PYSPARK_SUBMIT_ARGS", "SPARK_CONF_DIR",
                                                               "PYSPARK_GATEWAY_PORT")}
    done = subprocess.run([*command, str(script), *args], env={**clean, **env}, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ROWS 2" in done.stdout
    assert "does not yet fully support pandas" not in done.stderr  # handled, not printed by every worker
    return next(line.split()[1] for line in done.stdout.splitlines() if line.startswith("MASTER"))


@pytest.mark.slow  # starts Java three times
def test_a_new_session_honours_the_configured_master(tmp_path):
    """(``spark-submit --master`` is honoured too: tests/test_spark_cluster.py submits the CLI to a cluster.)"""
    assert _master(tmp_path, [sys.executable], {}) == "local[2]"  # nothing configured
    assert _master(tmp_path, [sys.executable], {"MASTER": "local[2]"}, "local[1]") == "local[1]"  # the caller's
    assert _master(tmp_path, [sys.executable], {"PYSPARK_SUBMIT_ARGS": "--master local[1] pyspark-shell"}) == "local[1]"
