# porter developer tasks. Everything installs what it needs; nothing assumes a prepared machine.
PYTHON      ?= python3
VENV        ?= .venv
CUDA_VENV   ?= .venv-cuda
TORCH_CPU   ?= torch==2.13.0
TORCH_CUDA  ?= torch==2.14.1
TRIXIE_ROOT ?= $(or $(PORTER_TRIXIE_ROOT),/var/lib/porter/trixie-rocm)
PY          := $(VENV)/bin/python
export HIP_PLATFORM := amd

.PHONY: help venv demo test test-unit test-integration typecheck rocm-debian chroot-trixie cuda-venv clean

help:
	@echo "make demo           install porter in $(VENV); prebuild DeepSpeed's CPU ops into ./wheelhouse;"
	@echo "                    install them offline into a fresh venv ($(NODE_VENV)) and verify (no JIT)"
	@echo "make test           run all tests (unit + integration)"
	@echo "make rocm-debian    apt-get install Debian 12's hipcc (HIP 5.2.3)"
	@echo "make chroot-trixie  debootstrap a Debian trixie chroot with ROCm 5.7.1 at $(TRIXIE_ROOT)"
	@echo "make cuda-venv      a venv with the CUDA build of torch ($(TORCH_CUDA)) for the cuda tier"

$(VENV)/.stamp: pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_CPU)" -e ".[test]"
	touch $@

venv: $(VENV)/.stamp

NODE_VENV   ?= .venv-node
DS_VERSION  ?= 0.19.8
CPU_OPS     ?= cpu_adam,cpu_adagrad,cpu_lion

# The main job on the built-in default (the 'cpu' profile): prebuild DeepSpeed's CPU ops from the PyPI
# sdist into ./wheelhouse, install them offline into a fresh "compute node" venv, and verify: no JIT.
demo: venv
	$(VENV)/bin/porter toolchain check cpu
	$(VENV)/bin/porter ops build --source deepspeed==$(DS_VERSION) --toolchain cpu --ops $(CPU_OPS) \
	  --with-deps -o wheelhouse
	rm -rf $(NODE_VENV) && $(PYTHON) -m venv $(NODE_VENV)
	$(NODE_VENV)/bin/python -m pip install -q "$(TORCH_CPU)"
	$(VENV)/bin/porter install wheelhouse --python $(NODE_VENV)/bin/python
	$(VENV)/bin/porter verify --python $(NODE_VENV)/bin/python

test: venv
	$(PY) -m pytest tests/unit tests/integration

test-unit: venv
	$(PY) -m pytest tests/unit

test-integration: venv
	$(PY) -m pytest tests/integration

typecheck: venv
	$(PY) -m mypy

rocm-debian:
	@command -v hipcc >/dev/null 2>&1 || { apt-get update -qq && \
	  apt-get install -y -qq hipcc libamdhip64-dev rocm-device-libs rocminfo; }

# ROCm 5.7.1 (Frontier's line) from Debian trixie, used through the debian-trixie-rocm profile's launcher.
chroot-trixie:
	@if [ -x "$(TRIXIE_ROOT)/usr/bin/hipcc" ]; then echo "trixie chroot already at $(TRIXIE_ROOT)"; else \
	  command -v debootstrap >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq debootstrap; }; \
	  mkdir -p "$(TRIXIE_ROOT)" && \
	  debootstrap --variant=minbase trixie "$(TRIXIE_ROOT)" >/dev/null && \
	  chroot "$(TRIXIE_ROOT)" apt-get install -y -qq hipcc libamdhip64-dev rocm-device-libs-17 g++ >/dev/null && \
	  echo "trixie chroot ready at $(TRIXIE_ROOT)"; fi

$(CUDA_VENV)/.stamp: pyproject.toml setup.py
	$(PYTHON) -m venv $(CUDA_VENV)
	$(CUDA_VENV)/bin/python -m pip install -q "$(TORCH_CUDA)" -e ".[test]"
	touch $@

cuda-venv: $(CUDA_VENV)/.stamp

clean:
	rm -rf build dist *.egg-info wheelhouse .pytest_cache $(NODE_VENV)
