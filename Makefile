# Two set-up commands on a fresh machine: `make render` and `make test`.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
SCANVENV := .venv-scan
ACCVENV := .venv-accuracy
STACK   ?= existing
OUT     ?= build/render/$(STACK)

.PHONY: render test venv scan-venv accuracy-venv engine e2e clean

$(BIN)/.installed: requirements.txt requirements-test.txt constraints.txt pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -c constraints.txt -r requirements-test.txt
	touch $@

$(SCANVENV)/bin/.installed: requirements-scan.txt
	test -x $(SCANVENV)/bin/python || $(PY) -m venv $(SCANVENV)
	$(SCANVENV)/bin/pip install -q --disable-pip-version-check -r requirements-scan.txt
	touch $@

# lm-eval for the accuracy smoke test (requirements-accuracy.txt says why it is apart).
$(ACCVENV)/bin/.installed: requirements-accuracy.txt
	test -x $(ACCVENV)/bin/python || $(PY) -m venv $(ACCVENV)
	$(ACCVENV)/bin/pip install -q --disable-pip-version-check -r requirements-accuracy.txt
	touch $@

venv: $(BIN)/.installed

scan-venv: $(SCANVENV)/bin/.installed

accuracy-venv: $(ACCVENV)/bin/.installed

render: venv
	$(BIN)/k3infra render --stack $(STACK) --out $(OUT)

test: venv scan-venv accuracy-venv
	K3INFRA_CHECKOV=$(abspath $(SCANVENV))/bin/checkov \
	K3INFRA_LM_EVAL=$(abspath $(ACCVENV))/bin/lm_eval $(BIN)/python -m pytest

# The real Pulumi engine and a Kubernetes control plane, built from Go modules into a cache
# outside the work tree (tools/engine/build.sh prints the bin dir as its last line).
engine:
	tools/engine/build.sh

# The real-engine tests (tests/e2e/, marked e2e): the README's paths with real binaries.
e2e: venv
	@start=$$(date +%s); \
	bin=$$(tools/engine/build.sh | tail -n 1); \
	echo "e2e: engine bin $$bin (build/reuse $$(( $$(date +%s) - start )) s)"; \
	K3INFRA_ENGINE_BIN=$$bin $(BIN)/python -m pytest -m e2e -p no:cacheprovider -s -rs tests/e2e; \
	rc=$$?; echo "e2e: total $$(( $$(date +%s) - start )) s"; exit $$rc

clean:
	rm -rf build
