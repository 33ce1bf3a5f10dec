# pipeline: developer entry points. Needs only Python >= 3.11 (+ Java 17 for the Spark
# tests, gcc for C extensions built from source). Everything else goes into .venv.

PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
VPIP := $(VENV)/bin/pip
EXTRAS ?= test,spark,broker,bench,lint
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=
# make test runs two pytest processes side by side: the JVM tests (Kafka, Spark, chaos)
# one after another, and the rest (tools/run_tests.py). TEST_JOBS=1: one process.
TEST_JOBS ?= 2
BROKER ?= tansu
CHAOS_ARGS ?=
FAST_MARKERS := not integration and not chaos and not spark and not slow and not kafka

.DEFAULT_GOAL := help
.PHONY: help venv test test-fast demo bench bench-quick bench-charts chaos lint mutants mutants-c clean kafka explore mutants-explore

help:
	@echo "make demo       the main job: 1M order events exported from Spark into the embedded broker, read back, verified"
	@echo "make test       the whole suite (unit, integration, chaos quick mode, spark, Apache Kafka)"
	@echo "make test-fast  pure tests only (no broker, no spark, nothing slow)"
	@echo "make bench      benchmarks -> bench/results/*.json + *.png charts (codec, producer, latency, Spark export; about an hour on 2 shared cores); BROKER=kafka: on Apache Kafka"
	@echo "make bench-quick  the same with small runs (producer 100k msgs, latency 2 s, export 50k rows; 1 round each)"
	@echo "make bench-charts  redraw the charts from bench/results/*.json into docs/bench/ (what the README shows)"
	@echo "make chaos      21 failure schedules on a 3-node Kafka x pipeline, confluent-kafka, aiokafka, and 8 transactional ones (~50 min)"
	@echo "make kafka      fetch the Apache Kafka jars (Maven Central) into ~/.cache/pipeline"
	@echo "make lint       ruff + mypy --strict (pipeline/ and the typing checks in tests/typecheck/)"
	@echo "make mutants    mutation testing of the ordering-critical producer code and the group consumer (docs/testing.md)"
	@echo "make mutants-c  the hand-written mutants of the C send path (tools/mutants_c.py)"
	@echo "make explore    N seeded fault schedules against the fake cluster (N=5000, SEED=random)"
	@echo "make mutants-explore  the explorer's score: the protocol's mutants it finds within 1,000 schedules"
	@echo "make clean      remove .venv and caches"

# (Re)install whenever pyproject.toml or a C extension changes (the install builds
# pipeline/protocol/_kernel.c, pipeline/producer/_speedups/_delivery.c, _send.c and
# pipeline/cluster/_writer.c in place). The venv itself is created only if missing.
$(STAMP): pyproject.toml pipeline/protocol/_kernel.c pipeline/producer/_speedups/_delivery.c \
		pipeline/producer/_speedups/_send.c pipeline/producer/_speedups/_shared.h \
		pipeline/cluster/_writer.c
	@test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPIP) install --disable-pip-version-check -q -e ".[$(EXTRAS)]"
	@$(VPY) tools/check_extensions.py
	@touch $@

venv: $(STAMP)

# The kafka tests fetch the jars themselves; fetching first keeps that out of a test's
# timing and says up front when java/mvn are missing (the kafka tests then skip).
test: $(STAMP)
	$(VPY) -m pipeline.testing.kafka --if-tools
	$(VPY) tools/run_tests.py $(if $(filter 1,$(TEST_JOBS)),--one) $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(VPY) -m pytest -q -m "$(FAST_MARKERS)" $(PYTEST_ARGS)

demo: $(STAMP)
	$(VPY) demo/run_demo.py

bench: $(STAMP)
	$(VPY) -m bench --broker $(BROKER)

bench-quick: $(STAMP)
	$(VPY) -m bench --quick --broker $(BROKER)

# CHAOS_ARGS="--seeds 7 --clients pipeline" replays one schedule.
chaos: $(STAMP)
	$(VPY) -m pipeline.testing.kafka
	$(VPY) -m chaoslab $(CHAOS_ARGS)

bench-charts: $(STAMP)
	$(VPY) -m bench.charts --out docs/bench

kafka: $(STAMP)
	$(VPY) -m pipeline.testing.kafka

# JOBS workers (default 2), each in its own scratch copy; results are cached in
# .mutants/, so a rerun only runs mutants whose code or tests changed.
JOBS ?= 2
mutants: $(STAMP)
	$(VPY) tools/mutants.py --jobs $(JOBS) $(MUTANTS_ARGS)

# The C send path's hand-written mutants (rebuilds the extensions in place, then restores).
mutants-c: $(STAMP)
	$(VPY) tools/mutants_c.py

# The schedule explorer (docs/testing.md). `make test` runs its
# 1,000-schedule CI sweep (tests/explore); this runs more, from a random seed by
# default (printed first), and says how often each guard was reached:
# make explore N=100000 SEED=7
N ?= 5000
SEED ?=
explore: $(STAMP)
	$(VPY) -m pipeline.testing.explore --schedules $(N) $(if $(SEED),--seed $(SEED),) --reach $(EXPLORE_ARGS)

# The explorer's teeth (docs/testing.md, "Does it have teeth?"): every mutant of the
# protocol's modules the deterministic suite kills, explored on 1,000 schedules from
# one fixed seed; found / missed per module. Cached in .mutants/explore.json, so a
# rerun only measures what changed. MUTANTS_EXPLORE_ARGS="--only FILE" narrows it.
mutants-explore: $(STAMP)
	$(VPY) tools/mutants_explore.py --jobs $(JOBS) $(MUTANTS_EXPLORE_ARGS)

lint: $(STAMP)
	$(VPY) tools/module_sizes.py
	$(VENV)/bin/ruff check pipeline tests chaoslab
	$(VENV)/bin/mypy --strict pipeline tests/typecheck

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis .mutants \
		.demo spark-warehouse metastore_db derby.log
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
