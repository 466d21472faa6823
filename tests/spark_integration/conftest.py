"""One local SparkSession and one real broker process for every Spark test.

The JVM takes 10-20 s to start, so the session is shared (session scope); each test uses journals
of its own. It is started before the first test runs (`pytest_runtestloop`), when any selected
test uses it, under its own budget (`spark_start_s_max`; past it the run ends with every thread's
traceback, a hang shown, not hidden): a start-up on a loaded machine (a minute or more at load 8)
is then not charged to the first test's 120 s timeout. The broker is `gazette serve` on loopback with its embedded keyspace. Spark's Python
workers are separate processes: they find the repository through PYTHONPATH and run the venv's
interpreter. The master, local[2,3], runs two tasks at a time and gives a failed task three
attempts, as a cluster would retry it (test_spark_sink.py fails a task once on purpose).
"""

from __future__ import annotations

import faulthandler
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Final

import pytest

from tests.gazette_consumer.sequencer.read_iter_testkit import Env, broker_env
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


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    """An in-process broker of its own (the sink's commit tests drive it without Spark)."""
    async with broker_env() as env:
        yield env


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


# Spark's start-up, before the tests: its budget (see the module docstring).
spark_start_s_max: Final = 600.0
# The session started before the tests, or why it could not start (raised to each test using it).
_started: dict[str, object] = {}


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> None:
    if session.config.option.collectonly or not any(
        "spark" in getattr(item, "fixturenames", ()) for item in session.items
    ):
        return
    faulthandler.dump_traceback_later(spark_start_s_max, exit=True)
    try:
        _started["session"] = _start_spark()
    except (Exception, pytest.skip.Exception) as err:  # A skip too: each test gets it.
        _started["error"] = err
    finally:
        faulthandler.cancel_dump_traceback_later()


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    if "error" in _started:
        raise _started["error"]  # type: ignore[misc]
    session = _started.pop("session", None) or _start_spark()
    try:
        yield session
    finally:
        session.stop()  # type: ignore[attr-defined]


def _start_spark() -> object:
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
    return session
