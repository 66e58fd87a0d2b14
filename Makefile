# Two set-up commands on a fresh machine: `make render` and `make test`.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
SCANVENV := .venv-scan
ACCVENV := .venv-accuracy
STACK   ?= existing
OUT     ?= build/render/$(STACK)

.PHONY: render test test-deps venv scan-venv accuracy-venv engine e2e clean

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

# What the fast tier needs beyond Python: Debian's nginx (the proxy and weights-source
# tests run the real one), installed where make runs as root as CI does, and two small Go
# parts (compose-go's loader for the Compose file, the pinned workload CRDs), built into
# the engine cache. A test that still cannot run says why in pytest's skip summary (-rs).
test-deps:
	@command -v nginx >/dev/null 2>&1 || { if [ "$$(id -u)" = 0 ]; then \
	  apt-get update -qq && apt-get install -y -qq --no-install-recommends nginx-light; \
	  else echo "make test: nginx-light is not installed (not root): the real-nginx tests skip"; fi; }

test: venv scan-venv accuracy-venv test-deps
	@out=$$(K3INFRA_ENGINE_PARTS="compose workload-crds" tools/engine/build.sh) || exit 1; \
	bin=$$(printf '%s\n' "$$out" | tail -n 1); \
	K3INFRA_ENGINE_BIN=$$bin K3INFRA_CHECKOV=$(abspath $(SCANVENV))/bin/checkov \
	K3INFRA_LM_EVAL=$(abspath $(ACCVENV))/bin/lm_eval $(BIN)/python -m pytest

# The real Pulumi engine and a Kubernetes control plane, built from Go modules into a cache
# outside the work tree (tools/engine/build.sh prints the bin dir as its last line).
engine:
	tools/engine/build.sh

# The project's test images (tools/images/build.sh): Debian packages packed with umoci,
# cached outside the work tree; built before the tests, which run without network.
E2E_IMAGES := pause proxy engine-cpu buildkit accuracy
# One pytest session per node module: each module starts its own node (its receipt's GPU
# product label, its images) on its own control plane; two in one session would share
# the node's name, ports and StorageClass (a run of both failed with 409 AlreadyExists).
NODE_MODULES := $(sort $(shell grep -l 'pytest.mark.node' tests/e2e/test_*.py))

# The real-engine tests (tests/e2e/, marked e2e): the README's paths with real binaries on
# loopback; then the node tier (marked node: a kubelet on containerd running the rendered
# pods), inside a network namespace made for it (tests/e2e/netns.sh; needs root). Two runs:
# the consumer tests fetch npm packages, and nothing inside the namespace reaches out.
e2e: venv
	@start=$$(date +%s); \
	out=$$(tools/engine/build.sh) || exit 1; bin=$$(printf '%s\n' "$$out" | tail -n 1); \
	echo "e2e: engine bin $$bin (build/reuse $$(( $$(date +%s) - start )) s)"; \
	t=$$(date +%s); for i in $(E2E_IMAGES); do tools/images/build.sh $$i >/dev/null || exit 1; done; \
	echo "e2e: images $(E2E_IMAGES) (build/reuse $$(( $$(date +%s) - t )) s)"; \
	K3INFRA_ENGINE_BIN=$$bin $(BIN)/python -m pytest -m "e2e and not node" -p no:cacheprovider -s -rs tests/e2e; \
	rc=$$?; echo "e2e: control-plane tier done at $$(( $$(date +%s) - start )) s (exit $$rc)"; \
	rc2=0; for m in $(NODE_MODULES); do \
	  K3INFRA_ENGINE_BIN=$$bin tests/e2e/netns.sh $(BIN)/python -m pytest -m "e2e and node" -p no:cacheprovider -s -rs $$m || rc2=1; \
	done; echo "e2e: node tier exit $$rc2; total $$(( $$(date +%s) - start )) s"; \
	[ $$rc -eq 0 ] && [ $$rc2 -eq 0 ]

clean:
	rm -rf build
