"""One local SparkSession and one real broker process for every Spark test.

The JVM takes 10-20 s to start, so the session is shared (session scope); each test uses journals
of its own. The broker is `gazette serve` on loopback with its embedded keyspace. Spark's Python
workers are separate processes: they find the repository through PYTHONPATH and run the venv's
interpreter. The master, local[2,3], runs two tasks at a time and gives a failed task three
attempts, as a cluster would retry it (test_spark_sink.py fails a task once on purpose).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from tests.spark_integration.spark_testkit import REPO, broker_process

if TYPE_CHECKING:
    from broker.testing.moto_server import MotoServer

try:
    import pyspark  # noqa: F401  (the optional "spark" extra)
except ImportError:  # Nothing here can run: not even the modules import.
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """host:port of a broker process serving the whole Spark test session."""
    with broker_process(tmp_path_factory.mktemp("spark-broker")) as port:
        yield f"127.0.0.1:{port}"


@pytest.fixture(scope="session")
def moto_server() -> Iterator[MotoServer]:
    """A moto S3 server (broker/testing/moto_server.py) for the tests of s3:// stores."""
    from broker.testing.moto_server import MotoServer  # boto3: only for the tests that need it.

    with MotoServer() as server:
        yield server


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process's S3 clients (the driver's, and brokers it starts) use moto's
    credentials, and no ~/.aws profile."""
    from broker.testing.moto_server import credentials_env

    for name, value in credentials_env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    pyspark_sql = pytest.importorskip("pyspark.sql")
    if subprocess.run(["java", "-version"], capture_output=True, check=False).returncode != 0:
        pytest.skip("Java is not installed: run `make system-deps`")
    # Python workers: this interpreter, this repository.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    paths = [str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    from broker.testing.moto_server import credentials_env

    builder = pyspark_sql.SparkSession.builder
    # Credentials of the moto S3 server (moto_server fixture) reach the Python workers as a
    # user's reach theirs: as the executors' environment (docs/spark.md, "s3:// stores").
    for name, value in credentials_env().items():
        builder = builder.config(f"spark.executorEnv.{name}", value)
    session = (
        builder.master("local[2,3]")
        .appName("gazette-spark-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
        .config("spark.python.worker.reuse", "true")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    from spark_integration import GazetteDataSource

    session.dataSource.register(GazetteDataSource)
    try:
        yield session
    finally:
        session.stop()
