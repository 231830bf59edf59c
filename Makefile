# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

export PREFECT_HOME ?= $(CURDIR)/.state/prefect
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS := 60
export RAY_AUTH_MODE := disabled
export RAY_USAGE_STATS_ENABLED := 0
export MLFLOW_DISABLE_TELEMETRY := true

.PHONY: demo test venv clean

venv: $(STAMP)

# Reinstall only when the package definition changed.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

# Prefect creates PREFECT_HOME but not its parents: a fresh clone has no .state yet.
demo: $(STAMP)
	mkdir -p "$(PREFECT_HOME)"
	$(VENV)/bin/gpuflows demo

test: $(STAMP)
	mkdir -p "$(PREFECT_HOME)"
	$(PY) -m pytest -q $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .state
