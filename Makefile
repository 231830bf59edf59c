# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
# `make server` (Prefect UI), `make mlflow-ui`, `make deploy` and `make worker` look at and deploy the flows.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

# One Prefect home for every entry point: the flows default to the same folder when PREFECT_HOME is unset
# (flows/__init__.py), so runs of `make demo`, `python -m flows.<name>` and the deployments all show in `make server`.
export GPUFLOWS_STATE_DIR ?= $(CURDIR)/.state
export PREFECT_HOME ?= $(GPUFLOWS_STATE_DIR)/prefect
export GPUFLOWS_HOME ?= $(CURDIR)
PORT ?= 4200
MLFLOW_PORT ?= 5000
# Where the links a run publishes (the flow run's `mlflow-run` artifact, under each chart) open the MLflow UI.
export GPUFLOWS_MLFLOW_UI_URL ?= http://127.0.0.1:$(MLFLOW_PORT)
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS := 60
export RAY_AUTH_MODE := disabled
export RAY_USAGE_STATS_ENABLED := 0
export MLFLOW_DISABLE_TELEMETRY := true

.PHONY: demo test test-fast venv clean server mlflow-ui deploy worker gpu-check gpu-wheels

venv: $(STAMP)

# Reinstall only when the package definition changed.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	mkdir -p "$(PREFECT_HOME)"
	touch $(STAMP)

# Prefect creates PREFECT_HOME but not its parents: a fresh clone has no .state yet.
demo: $(STAMP)
	mkdir -p "$(PREFECT_HOME)"
	$(VENV)/bin/gpuflows demo

# Test files run in TEST_WORKERS processes (pytest-xdist), each file whole in one of them: a module's server, Ray
# cluster or flow run is started once, and each process has its own Prefect home, state folder and MLflow store
# (tests/conftest.py). Much of a test's time is a server, a worker or a subprocess starting, so two processes
# finish in about half the time even on two cores. TEST_WORKERS=0 runs them in this process.
TEST_WORKERS ?= 2
XDIST := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

# The import rules first (pyproject.toml's [tool.importlinter], docs/architecture.md): a second, then the tests.
test: $(STAMP)
	mkdir -p "$(PREFECT_HOME)"
	$(VENV)/bin/lint-imports
	$(PY) -m pytest -q $(XDIST) $(PYTEST_ARGS)

# The inner loop: everything but the tests that start a Prefect server, Ray or a worker (marked slow).
test-fast: $(STAMP)
	mkdir -p "$(PREFECT_HOME)"
	$(VENV)/bin/lint-imports
	$(PY) -m pytest -q $(XDIST) -m "not slow" $(PYTEST_ARGS)

# The whole GPU path checked on this machine's CUDA devices, one PASS/FAIL/SKIP line per check (README "Running on
# GPUs"); without a GPU every check SKIPs. GPU_CHECK_ARGS: e.g. --quick --json gpu.json --only pool.
gpu-check: $(STAMP)
	$(PY) -m benchmarks.gpu_check $(GPU_CHECK_ARGS)

# Prefect 3.8.8 and its dependencies as Python 3.12 wheels in .whl/, for a GPU machine without network.
gpu-wheels:
	bash benchmarks/gpu_check_wheels.sh

# The Prefect UI and API on this home's database (runs of the embedded server included): http://127.0.0.1:$(PORT)
# The UI asks PREFECT_SERVER_API_PORT (not --port) where its API is: without it PORT=4291 serves a UI that
# calls 4200 and shows "Can't connect to Server API".
server: $(STAMP)
	mkdir -p "$(PREFECT_HOME)"
	PREFECT_SERVER_API_PORT=$(PORT) $(VENV)/bin/prefect server start --port $(PORT)

# The MLflow UI on the flows' store: http://127.0.0.1:$(MLFLOW_PORT) (runs started with the same MLFLOW_PORT link it).
mlflow-ui: $(STAMP)
	$(VENV)/bin/mlflow ui --backend-store-uri "sqlite:///$(GPUFLOWS_STATE_DIR)/mlflow.db" --port $(MLFLOW_PORT)

# With `make server` running: the work pool and every deployment of prefect.yaml, then a process worker. The
# serving rollouts' work queue runs one at a time (prefect.yaml): each leases whole nodes for its whole trace.
deploy: $(STAMP)
	PREFECT_API_URL=http://127.0.0.1:$(PORT)/api $(VENV)/bin/prefect work-pool create gpuflows --type process --overwrite
	PREFECT_API_URL=http://127.0.0.1:$(PORT)/api $(VENV)/bin/prefect --no-prompt deploy --all
	PREFECT_API_URL=http://127.0.0.1:$(PORT)/api $(VENV)/bin/prefect work-queue set-concurrency-limit serving 1 --pool gpuflows

worker: $(STAMP)
	PREFECT_API_URL=http://127.0.0.1:$(PORT)/api $(VENV)/bin/prefect worker start --pool gpuflows --type process

clean:
	rm -rf $(VENV) .state
