# gazette-py: the two commands a newcomer runs are `make demo` and `make test`.
# Everything the tests need is installed and started from here; nothing is assumed to have been
# installed by hand.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
# Below the kernel's ephemeral port range (32768-60999 on Linux): no outgoing connection can
# hold it when the cluster starts.
PG_PORT ?= 25432
PG_DIR := /tmp/gazette-test-pg-$(PG_PORT)
# pytest-xdist workers of `make test`'s first phase (0: the tests run in the pytest process).
PYTEST_WORKERS ?= 2
APT_GET := $(if $(filter 0,$(shell id -u)),,sudo) env DEBIAN_FRONTEND=noninteractive apt-get

# Sans-IO modules are type-checked with --strict; the rest with the default settings.
MYPY_STRICT := broker/durable_file.py broker/disk_errors.py broker/keyspace/backend.py broker/keyspace/mvcc.py broker/keyspace/mvcc_state.py broker/keyspace/keyspace.py broker/keyspace/embedded.py broker/keyspace/conformance.py broker/keyspace/conformance_kit.py broker/keyspace/conformance_kv.py broker/keyspace/conformance_leases.py broker/keyspace/conformance_watch.py broker/keyspace/conformance_mirror.py broker/allocator broker/fragment/cover_set.py broker/apply_txn.py broker/slot.py \
	broker/fragment/naming.py broker/fragment/spool.py broker/fragment/spool_state.py broker/fragment/spool_types.py broker/fragment/spool_roll.py broker/fragment/spool_compression.py broker/fragment/spool_file.py broker/fragment/spool_record.py broker/fragment/spool_recovery.py broker/fragment/spool_named.py broker/fragment/codecs.py \
	broker/append_rate.py broker/append_receive.py broker/read_staging.py broker/malloc_tuning.py broker/protocol/content_wire.py broker/protocol/selector.py broker/protocol/validate.py \
	broker/protocol/validation_error.py broker/protocol/tokens.py broker/protocol/urls.py broker/protocol/media_type.py broker/protocol/limits.py broker/protocol/labels.py \
	broker/cli/strict_yaml.py broker/cli/yaml_shape.py broker/loop_slices.py broker/lazy_exports.py broker/rpc_tasks.py \
	gazette_consumer/message gazette_consumer/sequencer gazette_consumer/transaction.py gazette_consumer/shard_spec.py broker/logging.py \
	gazette_consumer/recoverylog/fsm.py gazette_consumer/recoverylog/ops.py gazette_consumer/recoverylog/segments.py \
	gazette_consumer/stores/rocksdb.py gazette_consumer/stores/recorded.py \
	broker/keyspace/wal.py broker/keyspace/persisted.py broker/keyspace/changes.py broker/keyspace/change_codec.py broker/keyspace/request_checks.py broker/keyspace/embedded_watch.py \
	broker/fragment/verify.py broker/fragment/lost.py gazette_consumer/shard_retry.py broker/quorum

.PHONY: all demo test lint typecheck pytest install system-deps azurite pg-start pg-stop protos clean soak sim

all: test

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -e '.[dev,spark]'
	touch $(STAMP)

install: $(STAMP)

## demo: set up and run the main job on the embedded default (no external services): an
## exactly-once counting pipeline (broker, consumer shards, SQLite stores) in one process.
## Run as a module from the repository root, which holds the `examples` package it runs.
demo: install
	$(PY) -m gazette_consumer.demo

## system-deps: etcd and etcdctl (Debian etcd-server, etcd-client), PostgreSQL 15 server
## binaries, Java for Spark.
system-deps:
	@need=""; \
	command -v etcd >/dev/null || need="$$need etcd-server"; \
	command -v etcdctl >/dev/null || need="$$need etcd-client"; \
	test -x /usr/lib/postgresql/15/bin/initdb || need="$$need postgresql-15"; \
	command -v java >/dev/null || need="$$need openjdk-17-jre-headless"; \
	if [ -n "$$need" ]; then \
	  echo "installing system packages:$$need"; \
	  $(APT_GET) update -qq && $(APT_GET) install -y -qq $$need >/dev/null; \
	fi

## azurite: the Azure Blob Storage emulator the azure:// store tests run, from npm, under
## .tools/azurite (Node.js from the system; Debian's nodejs if missing). 3.37 is the first
## release that checks user delegation SAS of the current SDK's service version.
AZURITE_VERSION := 3.37.0
AZURITE_BIN := .tools/azurite/node_modules/.bin/azurite-blob
azurite: $(AZURITE_BIN)
$(AZURITE_BIN):
	command -v npm >/dev/null || { $(APT_GET) update -qq && $(APT_GET) install -y -qq nodejs npm >/dev/null; }
	mkdir -p .tools/azurite
	npm install --prefix .tools/azurite --no-audit --no-fund --silent azurite@$(AZURITE_VERSION)

## pg-start / pg-stop: a throwaway PostgreSQL cluster on loopback, run as a non-root user.
pg-start: system-deps
	scripts/pg_cluster.sh start $(PG_DIR) $(PG_PORT)

pg-stop:
	scripts/pg_cluster.sh stop $(PG_DIR) $(PG_PORT)

protos: install
	$(PY) scripts/gen_protos.py

## bench: every headline benchmark (benchmarks/bench_all.py, which starts its own durable
## PostgreSQL, etcd and `gazette serve` processes): writes benchmarks/results.json and
## regenerates the headline section of docs/benchmarks.md and its chart. QUICK=1: the same
## figures from fewer rounds and shorter windows, in under 3 minutes.
.PHONY: bench
bench: install system-deps
	$(PY) -c 'import matplotlib' 2>/dev/null || $(PIP) install --quiet -e '.[bench]'
	$(PY) benchmarks/bench_all.py $(if $(filter 1 yes true,$(QUICK)),--quick)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: install
	$(VENV)/bin/mypy --strict $(wildcard $(MYPY_STRICT))
	$(VENV)/bin/mypy broker gazette_consumer spark_integration

## pytest: the suite in two phases: every test not marked `serial` on PYTEST_WORKERS processes
## (pytest-xdist), then the `serial` ones alone (a whole cluster under faults, with time bounds
## that assume the machine to themselves). The second runs unless the first was interrupted or
## could not run (pytest's exit codes above 1); either failing fails the target.
## PYTEST_ARGS (a selection of your own) runs that once instead, in one process.
PYTEST := $(VENV)/bin/pytest -q -p no:cacheprovider --durations=30
pytest: install system-deps azurite
	@set -e; scripts/pg_cluster.sh start $(PG_DIR) $(PG_PORT); \
	trap 'scripts/pg_cluster.sh stop $(PG_DIR) $(PG_PORT)' EXIT; \
	export GAZETTE_TEST_PG_URL="postgresql+psycopg://gazette@127.0.0.1:$(PG_PORT)/gazette"; \
	$(if $(strip $(PYTEST_ARGS)),$(PYTEST) $(PYTEST_ARGS),$(PYTEST_PHASES))
PYTEST_PHASES := rc=0; \
	$(PYTEST) -n $(PYTEST_WORKERS) --dist worksteal -m "not serial" || rc=$$?; \
	if [ $$rc -gt 1 ]; then exit $$rc; fi; \
	$(PYTEST) -m serial || rc=$$?; \
	exit $$rc

## test: set up, provision etcd/PostgreSQL/Java, lint, type-check and run the whole suite.
test: lint typecheck pytest

## soak: the stream-sum workload on etcd, 3 brokers, 3 consumers, PostgreSQL and S3 (moto), all
## real processes, under injected faults for DURATION seconds (default 600); a line per fault, a
## summary table, exit 1 on any violation or unrecovered fault (docs/reliability.md).
DURATION ?= 600
soak: install system-deps
	$(PY) -m examples.stream_sum.soak --duration $(DURATION) $(SOAK_ARGS)

clean:
	rm -rf .tmp build dist *.egg-info .mypy_cache .ruff_cache .pytest_cache

## sim: the quorum protocol's deterministic simulation over many seeds, in every core
## (`make sim SEEDS=100000`; FIRST=N starts elsewhere). A failing seed prints the command that
## replays it step by step. `make test` runs 1,000 seeds.
SEEDS ?= 10000
FIRST ?= 0
.PHONY: sim
sim: install
	$(PY) -m broker.quorum.sim --seeds $(SEEDS) --first $(FIRST) --jobs $$(nproc)
