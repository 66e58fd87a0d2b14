# Two set-up commands on a fresh machine: `make render` and `make test`.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
SCANVENV := .venv-scan
STACK   ?= existing
OUT     ?= build/render/$(STACK)

.PHONY: render test venv scan-venv clean

$(BIN)/.installed: requirements.txt requirements-test.txt pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -r requirements-test.txt
	touch $@

$(SCANVENV)/bin/.installed: requirements-scan.txt
	test -x $(SCANVENV)/bin/python || $(PY) -m venv $(SCANVENV)
	$(SCANVENV)/bin/pip install -q --disable-pip-version-check -r requirements-scan.txt
	touch $@

venv: $(BIN)/.installed

scan-venv: $(SCANVENV)/bin/.installed

render: venv
	$(BIN)/k3infra render --stack $(STACK) --out $(OUT)

test: venv scan-venv
	K3INFRA_CHECKOV=$(abspath $(SCANVENV))/bin/checkov $(BIN)/python -m pytest

clean:
	rm -rf build
