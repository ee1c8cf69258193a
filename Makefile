# Everything bootstraps from nothing: `make test` on a fresh clone creates the
# venv, installs pinned dependencies, then lints, type-checks and runs pytest.
# Python 3.11+ (the pinned numpy/pyarrow need it); needs make and the venv module.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# What is installed: the dev set (make test: lint, types, tests) includes the demo's.
STAMP      := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.installed-demo
PYTEST_ARGS ?=
# The venv's own pip first (the one venv ships can be years old: slower to resolve,
# blind to newer wheels), at the version constraints.txt pins.
NEW_VENV := test -x $(BIN)/python || $(PYTHON) -m venv $(VENV); \
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -c constraints.txt --upgrade pip

.PHONY: venv demo demo-cluster test lint typecheck pytest protos lock clean

$(STAMP): pyproject.toml constraints.txt
	$(NEW_VENV)
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP) $(DEMO_STAMP)

# Only what the demo runs: pyspark, pylance, moto's S3 and DynamoDB (no linters, no
# type stubs, no test tools).
$(DEMO_STAMP): pyproject.toml constraints.txt
	@echo "make demo: installing lancetx with its [spark,embedded] extras (PySpark, pylance, moto) into $(VENV): ~1.2 GB, a few minutes the first time"
	$(NEW_VENV)
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[spark,embedded]'
	touch $(DEMO_STAMP)

venv: $(STAMP)

## The main job on the embedded default: Spark jobs and a pylance writer on one table,
## through an in-process moto server for S3 (legacy) + DynamoDB.
demo: $(DEMO_STAMP)
	$(BIN)/python -m lancetx.demo.spark

## The demo's Spark jobs on a standalone cluster of their own: a master and two workers
## started from the installed pyspark (executors in JVMs of their own), stopped by PID
## when it ends, fails or is interrupted.
demo-cluster: $(DEMO_STAMP)
	$(BIN)/python -m lancetx.demo.cluster

## Lint, type-check, then the whole test suite.
test: lint typecheck pytest

LINT_DIRS := $(wildcard lancetx pyspark_lancetx protos commit externalstore demo tests examples benchmarks tools localstack)

lint: $(STAMP)
	$(BIN)/ruff check $(LINT_DIRS)
	$(BIN)/ruff format --check $(filter-out protos,$(LINT_DIRS))

# mypy maps modules by directory, so it checks a view in which the top-level
# folders sit under lancetx/ as they do when installed.
typecheck: $(STAMP)
	rm -rf build/typecheck && mkdir -p build/typecheck/lancetx
	for f in lancetx/*; do ln -s ../../../$$f build/typecheck/lancetx/; done
	ln -s ../../../protos build/typecheck/lancetx/protos
	ln -s ../../../commit build/typecheck/lancetx/commit
	ln -s ../../../externalstore build/typecheck/lancetx/externalstore
	ln -s ../../../demo build/typecheck/lancetx/demo
	if [ -d pyspark_lancetx ]; then ln -s ../../pyspark_lancetx build/typecheck/pyspark_lancetx; fi
	cd build/typecheck && ../../$(BIN)/mypy -p lancetx $$([ -d pyspark_lancetx ] && echo -p pyspark_lancetx)

# Two workers: the suite mostly waits (servers, subprocesses, Spark), so a second one
# fills the idle time; every Spark test goes to one worker (one Spark session per run,
# tests/conftest.py). PYTEST_WORKERS=0 runs it in this process.
PYTEST_WORKERS ?= 2
pytest: $(STAMP)
	$(BIN)/pytest $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadscope) $(PYTEST_ARGS)

## The integration tests against LocalStack S3 + dynalite (Python >= 3.12 and npm; localstack/README.md).
.PHONY: test-localstack
test-localstack: $(STAMP)
	bash localstack/run_tests.sh $(ARGS)

## Rewrite docs/api.md from the public API's signatures and docstrings.
.PHONY: api-docs
api-docs: $(STAMP)
	$(BIN)/python tools/api_docs.py

## Regenerate protos/*_pb2.py and .pyi from protos/*.proto.
protos: $(STAMP)
	$(BIN)/python tools/regenerate_protos.py

## Re-resolve constraints.txt from the bounds in pyproject.toml: a scratch venv gets the
## newest pip and '.[dev]' (every extra), and the lock is exactly what it then holds.
lock:
	rm -rf build/lockenv && $(PYTHON) -m venv build/lockenv
	build/lockenv/bin/python -m pip install --quiet --upgrade pip
	build/lockenv/bin/python -m pip install --quiet '.[dev]'
	{ echo "# Exact pins for a fast, reproducible install (pip -c constraints.txt): exactly"; \
	  echo "# what a venv of lancetx[dev] holds, and its pip. Regenerate: make lock"; \
	  build/lockenv/bin/pip freeze --all --exclude lancetx; \
	} > constraints.txt

clean:
	rm -rf $(VENV) build *.egg-info
