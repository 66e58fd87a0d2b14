# Two set-up commands on a fresh machine: `make render` and `make test`.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
SCANVENV := .venv-scan
ACCVENV := .venv-accuracy
STACK   ?= existing
OUT     ?= build/render/$(STACK)

.PHONY: render test test-deps venv scan-venv accuracy-venv testbed e2e clean

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
# tests run the real one), installed where make runs as root as CI does, four small Go
# parts (compose-go's loader for the Compose file, the pinned workload CRDs, the S3 and
# GCS servers of the weights store tests), built into the testbed cache, and Azurite
# (npm, tools/azurite/package-lock.json) in its own cache. A test that still cannot run
# says why in pytest's skip summary (-rs).
test-deps:
	@command -v nginx >/dev/null 2>&1 || { if [ "$$(id -u)" = 0 ]; then \
	  apt-get update -qq && apt-get install -y -qq --no-install-recommends nginx-light; \
	  else echo "make test: nginx-light is not installed (not root): the real-nginx tests skip"; fi; }

test: venv scan-venv accuracy-venv test-deps
	@out=$$(K3INFRA_TESTBED_PARTS="compose workload-crds s3server fakegcs" tools/testbed/build.sh) || exit 1; \
	bin=$$(printf '%s\n' "$$out" | tail -n 1); \
	azurite=$$(tools/azurite/install.sh | tail -n 1) || exit 1; \
	K3INFRA_TESTBED_BIN=$$bin K3INFRA_AZURITE_BIN=$$azurite K3INFRA_CHECKOV=$(abspath $(SCANVENV))/bin/checkov \
	K3INFRA_LM_EVAL=$(abspath $(ACCVENV))/bin/lm_eval $(BIN)/python -m pytest

# The testbed: the real Pulumi CLI and a Kubernetes control plane (and the other Go parts
# the tests run), built from Go modules into a cache outside the work tree
# (tools/testbed/build.sh prints the bin dir as its last line).
testbed:
	tools/testbed/build.sh

# The project's test images (tools/images/build.sh): Debian packages packed with umoci,
# cached outside the work tree; built before the tests, which run without network.
E2E_IMAGES := pause proxy engine-cpu buildkit accuracy
# The testbed tests (tests/e2e/, marked e2e): the README's paths with real binaries on
# loopback (the control-plane tier), and the node tier (marked node: a kubelet on
# containerd running the rendered pods, the host stack's Compose file on Docker), inside
# network namespaces made for them (tests/e2e/netns.sh; needs root). tests/e2e/tiers.sh
# runs them in three lanes side by side, each on the testbed parts it needs (built or
# reused into ~/.cache/k3infra/testbed), and says why.
e2e: venv
	@start=$$(date +%s); \
	for i in $(E2E_IMAGES); do tools/images/build.sh $$i >/dev/null || exit 1; done; \
	echo "e2e: images $(E2E_IMAGES) (build/reuse $$(( $$(date +%s) - start )) s)"; \
	tests/e2e/tiers.sh $(abspath $(BIN))/python; rc=$$?; \
	echo "e2e: total $$(( $$(date +%s) - start )) s (exit $$rc)"; exit $$rc

clean:
	rm -rf build
