# Every target builds .venv itself on a fresh machine: python3 -m venv, then pip install.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-dev
BENCH_STAMP := $(VENV)/.installed-bench

.PHONY: demo test lint typecheck unit unit-pure sanitize sanitize-full fuse-deps kcat-deps powerloss soak chaos pipeline bench bench-full bench-spark clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# The tests include the Spark data source, so the dev install takes the spark extra too.
$(STAMP): pyproject.toml setup.py commitlog/_native.c commitlog/_scan.c commitlog/_appender.c commitlog/_feed.c commitlog/_native.h commitlog/_columns.c consumequeue/_time.c commitlog/_dispatch.c segmented/_records.c mqstore/broker/_kafka_codec.c mqstore/_put.c consumequeue/_runs.c consumequeue/_units.c | $(PY)
	$(PY) -m pip install --quiet -e '.[dev,spark]'
	touch $(STAMP)

# The demo needs the package alone: no dev tools, no Spark.
DEMO_STAMP := $(VENV)/.installed-demo
$(DEMO_STAMP): pyproject.toml setup.py commitlog/_native.c commitlog/_scan.c commitlog/_appender.c commitlog/_feed.c commitlog/_native.h commitlog/_columns.c consumequeue/_time.c commitlog/_dispatch.c segmented/_records.c mqstore/broker/_kafka_codec.c mqstore/_put.c consumequeue/_runs.c consumequeue/_units.c | $(PY)
	$(PY) -m pip install --quiet -e .
	touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(PY) -m mqstore.demo --path ./demo-data

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

typecheck: $(STAMP)
	$(PY) -m mypy

# The power-loss filesystem (bench/powerfs.py) needs FUSE: Debian's fuse3 (fusermount3,
# libfuse3) and /dev/fuse. CI runs as root and installs it; elsewhere install it by hand.
fuse-deps:
	@command -v fusermount3 >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq --no-install-recommends fuse3)

# kcat (Debian's librdkafka CLI), a client of the broker's conformance tests.
kcat-deps:
	@command -v kcat >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq --no-install-recommends kcat)

# MQSTORE_REQUIRE_NATIVE: a build that fell back to pure Python fails instead of passing slowly.
# MQSTORE_REQUIRE_FUSE: the power-loss tests fail, rather than skip, without FUSE.
# MQSTORE_REQUIRE_KCAT: the kcat conformance test fails, rather than skips, without kcat.
unit: $(STAMP) fuse-deps kcat-deps
	MQSTORE_REQUIRE_NATIVE=1 MQSTORE_REQUIRE_FUSE=1 MQSTORE_REQUIRE_KCAT=1 $(PY) -m pytest -q

# The pure-Python twins of the C module: what a machine without a C compiler runs.
PURE_TESTS := tests/commitlog tests/consumequeue tests/dispatch tests/indexfile \
	tests/mqstore/test_store.py tests/mqstore/test_store_model.py \
	tests/mqstore/test_reader.py tests/mqstore/test_batch.py tests/mqstore/test_engine.py \
	tests/mqstore/test_corruption.py tests/mqstore/test_kafka.py tests/mqstore/test_kafka_producer.py \
	tests/mqstore/broker/test_fetch_batch.py tests/mqstore/broker/test_produce_columns.py \
	tests/mqstore/broker/test_column_log.py
unit-pure: $(STAMP)
	MQSTORE_PURE_PYTHON=1 $(PY) -m pytest -q -p no:cacheprovider $(PURE_TESTS)

# The C module under ASan + UBSan in a scratch copy (never the tree's .so): the C-facing
# tests and a fuzz of every native function; fails on any finding. ~1 min / ~9 min.
sanitize: $(STAMP)
	PY=$(abspath $(PY)) scripts/sanitize.sh quick

sanitize-full: $(STAMP)
	PY=$(abspath $(PY)) scripts/sanitize.sh full

test: lint typecheck unit unit-pure sanitize

# 200 simulated power cuts (bench/powerfs.py), alternating sync and async flush.
powerloss: $(STAMP) fuse-deps
	$(PY) -m bench.powerloss --cuts 200 --json bench/results/powerloss.json

# 500 SIGKILL/restart iterations and a 10-minute soak; prints the figures.
soak: $(STAMP)
	$(PY) -m bench.crash_harness --iterations 500 --json bench/results/crash_harness.json
	$(PY) -m bench.soak --minutes 10 --json bench/results/soak.json

# Issue 18's chaos suite (bench/chaos.py): 10 minutes per seed of SIGKILLs, SIGSTOPs,
# cuts of the replication link, power cuts and promotions (mqstore promote) under
# acks=all idempotent producers and a consumer group, clients bootstrapped with both
# nodes; fails on any anomaly. make test runs a 60 s version (tests/bench/test_chaos.py).
chaos: $(BENCH_STAMP) fuse-deps
	$(PY) -m bench.chaos --seconds 600 --seed 1 2 3 --failover --out bench/results/chaos.json

# Events from a service -> Spark structured streaming (windowed counts) -> a topic -> a consumer.
pipeline: $(STAMP)
	$(PY) -m examples.pipeline --path ./pipeline-data

$(BENCH_STAMP): pyproject.toml setup.py commitlog/_native.c commitlog/_scan.c commitlog/_appender.c commitlog/_feed.c commitlog/_native.h commitlog/_columns.c consumequeue/_time.c commitlog/_dispatch.c segmented/_records.c mqstore/broker/_kafka_codec.c mqstore/_put.c consumequeue/_runs.c consumequeue/_units.c | $(PY)
	$(PY) -m pip install --quiet -e '.[dev,spark,bench]'
	touch $(BENCH_STAMP)

# Every benchmark the report draws on (bench/suite.py), then bench/REPORT.md and bench/plots/
# from their JSON under bench/results/. Quick: about half an hour on this machine.
bench: $(BENCH_STAMP)
	$(PY) -m bench.suite

bench-full: $(BENCH_STAMP)
	$(PY) -m bench.suite --full

bench-spark: $(STAMP)
	$(PY) -m bench.spark

clean:
	rm -rf $(VENV) demo-data pipeline-data .pytest_cache .mypy_cache .ruff_cache
