r"""The Spark session of a geography release: the one that exists, the master Spark is configured with, or
``local[2]``.

:func:`spark_session` returns the active session if there is one (a notebook's, or the one a
``spark-submit`` job made), else builds one. It sets the master only when asked (``master=``, the
CLI's ``--master``) or when nothing configures one; a master that Spark's own configuration gives is
never overridden:

* ``spark-submit --master ...`` (or any run inside ``spark-submit`` or a ``pyspark`` shell, which always
  has a master: the process then has ``PYSPARK_GATEWAY_PORT``);
* ``--master`` in ``PYSPARK_SUBMIT_ARGS`` (how PySpark starts its JVM from plain ``python``);
* the ``MASTER`` environment variable (read by ``spark-submit``);
* ``spark.master`` in ``spark-defaults.conf`` (under ``SPARK_CONF_DIR``, else ``SPARK_HOME/conf``).

With ``SPARK_REMOTE`` set (``sc://host:15002``) the session is a Spark Connect client of that server,
whose own configuration (master, memory, file systems) applies.

Otherwise the session is local with ``DEFAULT_MASTER`` (two cores: the machines this engine is
benchmarked on). Spark's own default when nothing is set would be every local core.

PySpark warns that it "does not yet fully support pandas >= 3.0.0" in the driver and again in every
Python worker that converts a batch. hdmm's Spark engine is tested with the pandas and PySpark that pip
installs together, so that warning (``PANDAS_WARNING``) is silenced in the driver and, for the sessions
made here, in the workers (``spark.executorEnv.PYTHONWARNINGS``).

>>> configured_master({"MASTER": "spark://head:7077"})
True
>>> configured_master({"PYSPARK_SUBMIT_ARGS": "--driver-memory 4g pyspark-shell", "SPARK_CONF_DIR": "/nowhere"})
False
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import warnings
from collections.abc import Mapping
from pathlib import Path

__all__ = ["spark_session", "require_spark", "configured_master", "quiet_pandas_warnings", "DEFAULT_MASTER", "PANDAS_WARNING"]

#: The master of a new session when neither the caller nor Spark's configuration names one.
DEFAULT_MASTER = "local[2]"

#: The start of PySpark's warning about the pandas version, silenced (module docstring).
PANDAS_WARNING = "PySpark does not yet fully support pandas"


def require_spark() -> None:
    """Refuse early, naming what to install, when PySpark or Java is missing."""
    try:
        import pyspark  # noqa: F401
        from pyspark.sql import SparkSession  # noqa: F401
    except ImportError:
        raise ImportError("the Spark engine needs PySpark: pip install 'hdmm[spark]' (and Java 17+)") from None
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        raise RuntimeError("the Spark engine needs Java 17 or later: install a JDK and put java on PATH (or set "
                           "JAVA_HOME)")


def configured_master(environ: Mapping[str, str] | None = None) -> bool:
    """Whether Spark's configuration names a master (module docstring), from ``environ`` (default
    ``os.environ``) and the ``spark-defaults.conf`` it points to."""
    env = os.environ if environ is None else environ
    if env.get("PYSPARK_GATEWAY_PORT") or env.get("MASTER"):
        return True
    if "--master" in shlex.split(env.get("PYSPARK_SUBMIT_ARGS", "")):
        return True
    conf = env.get("SPARK_CONF_DIR") or (str(Path(env["SPARK_HOME"]) / "conf") if env.get("SPARK_HOME") else None)
    defaults = None if conf is None else Path(conf) / "spark-defaults.conf"
    if defaults is None or not defaults.is_file():
        return False
    for line in defaults.read_text().splitlines():
        words = line.split(None, 1)
        if words and words[0] == "spark.master":
            return True
    return False


def quiet_pandas_warnings() -> None:
    """Silence, in this process, PySpark's warnings about the pandas version (``PANDAS_WARNING``, and the
    ``copy`` keyword pandas 3 deprecates): the conversions hdmm makes are tested."""
    warnings.filterwarnings("ignore", message=PANDAS_WARNING, category=FutureWarning)
    warnings.filterwarnings("ignore", message="The copy keyword is deprecated", module="pyspark")


def spark_session(master: str | None = None, memory: str = "4g"):
    """A Spark session for hdmm: the active one if any (with a warning if ``master`` names another), else a new one on ``master``, or on the master Spark's
    configuration names, or on ``DEFAULT_MASTER`` (module docstring). A new session's driver (in local mode
    also the executors) gets ``memory`` when it starts here (under ``spark-submit`` its JVM is already
    running: give ``--driver-memory`` there)."""
    require_spark()
    from pyspark.sql import SparkSession

    quiet_pandas_warnings()
    active = SparkSession.getActiveSession()
    if active is not None:
        if master is not None and active.conf.get("spark.master", None) not in (None, master):
            warnings.warn(f"a Spark session on {active.conf.get('spark.master')} is active and is used; the master "
                          f"{master!r} is not applied (stop that session first to use another)", RuntimeWarning,
                          stacklevel=2)
        return active
    if os.environ.get("SPARK_REMOTE"):  # Spark Connect: the server's configuration is the server's
        if master is not None:
            warnings.warn(f"SPARK_REMOTE names a Spark Connect server ({os.environ['SPARK_REMOTE']}), which is used; "
                          f"the master {master!r} is not applied", RuntimeWarning, stacklevel=2)
        return SparkSession.builder.appName("hdmm").getOrCreate()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = (SparkSession.builder.appName("hdmm")
               .config("spark.sql.execution.arrow.pyspark.enabled", "true")
               .config("spark.sql.shuffle.partitions", "8")
               .config("spark.driver.memory", memory)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.io.encryption.enabled", "true")  # checkpoints and shuffles on local disks
               .config("spark.executorEnv.PYTHONWARNINGS", f"ignore:{PANDAS_WARNING}:FutureWarning"))
    if master is None and not configured_master():
        master = DEFAULT_MASTER
    return (builder if master is None else builder.master(master)).getOrCreate()
