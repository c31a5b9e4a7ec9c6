# Two entry points for a fresh machine: `make serve` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test lint typecheck pytest docs serve bench clean protos

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,ray,docs]'
	touch $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

# perf_analyzer (below) is what tests/integration/test_perf_analyzer.py (serial) drives; where
# it cannot be made (no network) those tests skip and say why, and the rest run.
#
# The suite runs on PYTEST_WORKERS workers (one per core by default: `make test
# PYTEST_WORKERS=0` runs it in this process), each file on one worker, the longest files first
# (tests/conftest.py's LONGEST_FIRST; --no-loadscope-reorder keeps that order); then the tests
# marked `serial` (tests/conftest.py: they measure speed) run alone. pytest's exit status 5 is
# "no test selected", for a PYTEST_ARGS that names none of one kind.
# PYTHONDONTWRITEBYTECODE is cleared for the tests (__pycache__/ is ignored by git): the
# suite starts ~200 Python processes (daemons, children), and with it set each would compile
# the package's ~250 modules again (~0.4 s of CPU each).
PYTEST_WORKERS ?= auto
.PHONY: pytest-parallel pytest-serial
pytest: $(STAMP)
	@$(MAKE) --no-print-directory pytest-parallel
	@$(MAKE) --no-print-directory pytest-serial
pytest-parallel pytest-serial: export PYTHONDONTWRITEBYTECODE =
pytest-parallel: $(STAMP)
	$(BIN)/pytest -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not serial" \
	  $(PYTEST_ARGS) || [ $$? -eq 5 ]
pytest-serial: $(STAMP)
	-@[ -n "$(PERF_ANALYZER_TRIED)" ] || $(MAKE) --no-print-directory perf-analyzer
	$(BIN)/pytest -m serial $(PYTEST_ARGS) || [ $$? -eq 5 ]

# The documentation site (mkdocs.yml, docs/) into site/; strict: a warning (a broken link or
# anchor, a page missing from the nav, a snippet's file missing) fails the build. Not --quiet:
# it hides the warnings from the count, and a broken build passes. NO_MKDOCS_2_WARNING: Material
# prints a banner about MkDocs 2 on every build otherwise.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# make test: ruff and the docs first (seconds), then mypy beside the parallel phase (mypy is
# one process for ~30 s, and that phase leaves part of a core idle: daemons starting, loopback
# waits), its output printed when the phase ends, then the serial phase alone. Either failing
# fails the target. perf_analyzer, which only the serial phase drives, is made beside the
# parallel phase too (~20 s on a fresh clone, mostly downloads; its own log as always).
TYPECHECK_LOG := .mypy_cache/make-test.log
test: lint docs $(STAMP)
	@mkdir -p .mypy_cache
	@( $(BIN)/mypy > $(TYPECHECK_LOG) 2>&1 ) & mypy=$$!; \
	  ( $(MAKE) --no-print-directory perf-analyzer ) & peer=$$!; \
	  $(MAKE) --no-print-directory pytest-parallel; tests=$$?; \
	  wait $$peer; wait $$mypy; typed=$$?; echo "$(BIN)/mypy (beside the parallel phase):"; \
	  cat $(TYPECHECK_LOG); [ $$tests -eq 0 ] && [ $$typed -eq 0 ]
	$(MAKE) --no-print-directory pytest-serial PERF_ANALYZER_TRIED=1

serve: $(STAMP)
	$(BIN)/model-runtime serve $(SERVE_ARGS)

# Regenerate the protobuf/gRPC code of model_runtime/server/triton/*.proto (needs grpcio-tools,
# not installed by `make install`: pip install grpcio-tools); commit what changes.
protos: $(STAMP)
	PYTHON=$(abspath $(BIN))/python model_runtime/server/triton/generate.sh

# Benchmarks (DESIGN §13, issue 13): `make bench` runs them all in one run, then writes
# benchmarks/RESULTS.md and the bench block of docs/benchmarks.md, whose link goes to the site's
# results.md, the page that includes RESULTS.md (benchmarks/report.py). A benchmark that
# fails is reported missing (or stale) and the others still count. The HTTP peers (MLServer,
# KServe's server) get venvs of their own under .venv-peers/ (they pin fastapi, pydantic,
# protobuf, uvicorn), with our onnxruntime version; where one cannot be made (no network) the
# HTTP benchmark skips it and says so. BENCH_SECONDS/HTTP_SECONDS: seconds per point.
# benchmarks/dynamic_shapes.py is issue 29's dynamic point (text classifier, 5 seq lengths);
# benchmarks/memory.py issue 34's memory table (the daemon's RSS per model and per replica);
# benchmarks/sequences.py issue 32's sequence throughput (against the model run stateless).
# benchmarks/front_end_split.py (issue 31): one daemon, two sharing a port, Triton, c=16.
BENCH_SECONDS ?= 3
HTTP_SECONDS ?= 4
# benchmarks/triton_peer.py (issue 31): perf_analyzer's measurement window in seconds (it takes
# 3 stable windows or more per point); our load generator measures 3 windows' worth per point.
TRITON_SECONDS ?= 1
# benchmarks/python_models.py (issue 43): the same python models (add_sub, a batching
# onnxruntime model.py) on ours and on Triton, perf_analyzer's window in seconds; the same
# window for benchmarks/ensembles.py (issue 47: python pre -> ONNX -> python post).
PYTHON_MODELS_SECONDS ?= 2
PEERS := .venv-peers
.PHONY: peers

peers: $(PEERS)/mlserver/.installed $(PEERS)/kserve/.installed $(PEERS)/triton/.installed \
  $(PEERS)/perf_analyzer/.installed

$(PEERS)/%/.installed: benchmarks/peers/%.txt | $(STAMP)
	@rm -rf $(PEERS)/$*
	@echo "making $(PEERS)/$* (log: $(PEERS)/$*.log)"
	@mkdir -p $(PEERS)
	@( $(PYTHON) -m venv $(PEERS)/$* \
	  && $(PEERS)/$*/bin/python -m pip install --quiet --retries 2 --timeout 15 --upgrade pip \
	  && $(PEERS)/$*/bin/python -m pip install --quiet --retries 2 --timeout 15 -r $< \
	     "onnxruntime==$$($(BIN)/python -c 'import onnxruntime; print(onnxruntime.__version__)')" \
	) > $(PEERS)/$*.log 2>&1 \
	|| { tail -5 $(PEERS)/$*.log; rm -rf $(PEERS)/$*; echo "could not make $(PEERS)/$*"; exit 1; }
	@touch $@

# NVIDIA's real Triton server as a peer (issue 31, benchmarks/triton_peer.py): the tritonserver
# binary the nvidia-pytriton wheel ships, with its python backend, laid out in .venv-peers/triton
# (a venv with benchmarks/peers/triton.txt and our onnxruntime version) by
# benchmarks/peers/triton_install.sh. Its binaries need glibc 2.34: no sysroot here.
.PHONY: triton-peer
triton-peer: $(PEERS)/triton/.installed

$(PEERS)/triton/.installed: benchmarks/peers/triton.txt benchmarks/peers/triton_install.sh | $(STAMP)
	@echo "making $(PEERS)/triton (log: $(PEERS)/triton.log)"
	@mkdir -p $(PEERS)
	@bash benchmarks/peers/triton_install.sh $(PEERS)/triton $(PYTHON) \
	  "$$($(BIN)/python -c 'import onnxruntime; print(onnxruntime.__version__)')" \
	  > $(PEERS)/triton.log 2>&1 \
	|| { rm -rf $(PEERS)/triton; \
	     echo "could not make $(PEERS)/triton: $$(tail -1 $(PEERS)/triton.log)"; exit 1; }
	@touch $@

# NVIDIA's perf_analyzer, the load generator Triton users measure servers with, run against our
# daemon by benchmarks/peers/perf_analyzer (tests/perf_analyzer.py from Python). Its binary needs
# glibc 2.38 (this machine has 2.36), so benchmarks/peers/perf_analyzer_install.sh unpacks
# Debian trixie's libc6 & co. into .venv-peers/perf_analyzer/sysroot/ beside the wheel: a
# private loader and libraries, nothing installed over the system's. Pinned, hash-checked.
.PHONY: perf-analyzer
perf-analyzer: $(PEERS)/perf_analyzer/.installed

$(PEERS)/perf_analyzer/.installed: benchmarks/peers/perf_analyzer_install.sh | $(STAMP)
	@echo "making $(PEERS)/perf_analyzer (log: $(PEERS)/perf_analyzer.log)"
	@mkdir -p $(PEERS)
	@bash $< $(PEERS)/perf_analyzer $(BIN)/python > $(PEERS)/perf_analyzer.log 2>&1 \
	|| { echo "could not make $(PEERS)/perf_analyzer: $$(tail -1 $(PEERS)/perf_analyzer.log)"; exit 1; }
	@touch $@

bench: $(STAMP)
	-$(MAKE) --no-print-directory -k peers
	@mkdir -p benchmarks/results && date +%s > benchmarks/results/.bench-started
	-$(BIN)/python benchmarks/runner_throughput.py --seconds $(BENCH_SECONDS)
	-$(BIN)/python benchmarks/compiled_vs_source.py
	-$(BIN)/python benchmarks/http_throughput.py --seconds $(HTTP_SECONDS)
	-$(BIN)/python benchmarks/dynamic_shapes.py --seconds $(BENCH_SECONDS)
	-$(BIN)/python benchmarks/triton_peer.py --seconds $(TRITON_SECONDS)
	-$(BIN)/python benchmarks/front_end_split.py --seconds 2
	-$(BIN)/python benchmarks/grpc_transport.py --seconds 2
	-$(BIN)/python benchmarks/grpc_transport.py --compare tls --seconds 2
	-$(BIN)/python benchmarks/memory.py
	-$(BIN)/python benchmarks/sequences.py
	-$(BIN)/python benchmarks/python_models.py --seconds $(PYTHON_MODELS_SECONDS)
	-$(BIN)/python benchmarks/ensembles.py --seconds $(PYTHON_MODELS_SECONDS)
	$(BIN)/python benchmarks/report.py --since-file benchmarks/results/.bench-started \
	  --readme docs/benchmarks.md --results-link results.md

# Overload (issue 19): the daemon at 3x its measured capacity, then 0.5x; 3,000 idle
# connections. MLP 784-3072-3072-10 (issue 46: the device is the limit, not the loop; `--mlp`
# picks another). Writes benchmarks/results/overload.{json,md}. OVERLOAD_SECONDS shortens it.
# OVERLOAD_MULTIPLES: the open-loop rates (multiples of C) run one after the other.
OVERLOAD_SECONDS ?= 30
OVERLOAD_MULTIPLES ?= 3,2,1.5
.PHONY: bench-overload
bench-overload: $(STAMP)
	$(BIN)/python benchmarks/overload.py --seconds $(OVERLOAD_SECONDS) --multiples $(OVERLOAD_MULTIPLES)

# Issue 41's attacks on the wire at full size (tests/attack, with the soak runs --long enables).
.PHONY: attack
attack: $(STAMP)
	$(BIN)/pytest tests/attack --long $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) build site *.egg-info .pytest_cache .mypy_cache .ruff_cache
