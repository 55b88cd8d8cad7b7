# gtopk-lab: two commands set everything up on a fresh machine.
#   make demo   creates .venv, installs, runs a small sweep on an embedded LocalCluster,
#               writes results and an HTML report under results/demo
#   make test   creates .venv if needed, installs with dev extras, runs the whole suite
#   make test-stress   the same suite with busy CPU loops beside it (see below)
#   make lab    JupyterLab from .venv on notebooks/ (127.0.0.1:8888, PORT=... ; the quickstart first)
PYTHON ?= python3
VENV   ?= .venv
# The CPU wheel of this torch lies on the build machines' disk; override as needed,
# e.g. `make test TORCH=torch==2.6.0`.
TORCH  ?= torch==2.13.0
BIN    := $(VENV)/bin
OUT    ?= results/demo
# The suite runs in this many pytest-xdist processes, one test file each at a time
# (--dist loadfile keeps a file's cluster fixtures in one process; the notebooks are two
# files so that two processes take some). Many tests wait on paced links, timeouts and
# kernels: at -n 2 the 2 cores were busy 90% of a suite (633 s), at -n 3 98% (584 s, the
# same commit, 2026-12-06). `make test JOBS=0` runs serially.
# (Not --dist loadgroup: with pytest 9.2, pytest-xdist 3.8's xdist_group marks group nothing;
# tests/suite_schedule.py puts the testbed files in one process and the longest files first.)
JOBS   ?= 3
# `make test-stress` runs the suite (or TESTS=...) RUNS times in a row with LOOPS busy shell
# loops beside it, a loaded machine on purpose: a test that fails only under load is a bug.
# The loops are stopped when the recipe ends, passed or failed or interrupted.
LOOPS  ?= 2
RUNS   ?= 1
TESTS  ?=
# `make lab` serves JupyterLab here (127.0.0.1 only); `make lab PORT=8899` for another port.
PORT   ?= 8888

.PHONY: demo test test-stress install install-dev bench clean lab

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e .
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed pyproject.toml
	$(BIN)/python -m pip install -q -e ".[dev]"
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $@

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

demo: $(VENV)/.installed
	$(BIN)/gtopk-lab demo --out $(OUT)

test: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -q --durations=25 $(if $(filter 0,$(JOBS)),,-n $(JOBS) --dist loadfile)

test-stress: $(VENV)/.installed-dev
	@pids=""; trap 'kill $$pids 2>/dev/null; wait $$pids 2>/dev/null' EXIT; trap 'exit 130' INT TERM; \
	for i in $$(seq $(LOOPS)); do (while :; do :; done) & pids="$$pids $$!"; done; \
	echo "test-stress: $(LOOPS) busy loops (pids$$pids), $(RUNS) run(s)"; \
	for run in $$(seq $(RUNS)); do \
	  echo "test-stress: run $$run of $(RUNS)"; \
	  $(BIN)/python -m pytest -q --durations=25 $(if $(filter 0,$(JOBS)),,-n $(JOBS) --dist loadfile) \
	    $(TESTS) || exit $$?; \
	done

# --port-retries=0: a port in use is an error, so the URL printed is the one served;
# the server's own line with the token follows ($$JUPYTER_TOKEN sets one). As root (a
# container, the CI) Jupyter refuses to start without --allow-root.
lab: $(VENV)/.installed-dev
	@echo "JupyterLab: http://127.0.0.1:$(PORT)/lab/tree/00_quickstart.ipynb (the token is in the server's URL below; Ctrl-C stops it)"
	cd notebooks && exec "$(abspath $(BIN))/jupyter" lab --no-browser --ip=127.0.0.1 --port=$(PORT) \
	  --port-retries=0 --ServerApp.root_dir=. --LabApp.default_url=/lab/tree/00_quickstart.ipynb \
	  $(if $(filter 0,$(shell id -u)),--allow-root)

bench: $(VENV)/.installed
	$(BIN)/python benchmarks/collectives.py

clean:
	rm -rf $(VENV) results .pytest_cache
