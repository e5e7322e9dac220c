# porter developer tasks. Everything installs what it needs; nothing assumes a prepared machine.
PYTHON      ?= python3
VENV        ?= .venv
CUDA_VENV   ?= .venv-cuda
TORCH_CPU   ?= torch==2.13.0
TORCH_CUDA  ?= torch==2.14.1
TRIXIE_ROOT ?= $(or $(PORTER_TRIXIE_ROOT),/var/lib/porter/trixie-rocm)
ROCM7_ROOT  ?= $(or $(PORTER_ROCM7_ROOT),/var/lib/porter/sid-rocm7)
PY          := $(VENV)/bin/python
export HIP_PLATFORM := amd

.PHONY: help venv demo test test-unit test-unit-no-torch notorch-venv test-integration typecheck rocm-debian chroot-trixie cuda-venv clean
.PHONY: chroot-rocm7 image-base image-base-rocm cuda-torch

help:
	@echo "make demo           install porter in $(VENV); prebuild DeepSpeed's CPU ops into ./wheelhouse;"
	@echo "                    install them offline into a fresh venv ($(NODE_VENV)) and verify (no JIT)"
	@echo "make test           run all tests (unit + integration)"
	@echo "make rocm-debian    apt-get install Debian 12's hipcc (HIP 5.2.3)"
	@echo "make chroot-trixie  debootstrap a Debian trixie chroot with ROCm 5.7.1 at $(TRIXIE_ROOT)"
	@echo "make chroot-rocm7   debootstrap a Debian sid chroot with ROCm 7.2 (experimental) at $(ROCM7_ROOT)"
	@echo "make cuda-venv      a venv with the CUDA build of torch ($(TORCH_CUDA)) for the cuda tier"
	@echo "make image-base     debootstrap Debian bookworm with a CPU torch at $(IMAGE_BASE) (an image test's base)"
	@echo "make image-base-rocm  debootstrap sid with ROCm 7.2's runtime (HIP, RCCL, libfabric) at $(IMAGE_BASE_ROCM)"

# pip -qq: errors still show; setuptools' note that an editable install is editable (InformationOnly) does not
$(VENV)/.stamp: pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -qq --upgrade pip
	$(PY) -m pip install -qq "$(TORCH_CPU)" -e ".[test]"
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
	$(NODE_VENV)/bin/python -m pip install -qq "$(TORCH_CPU)"
	$(VENV)/bin/porter install wheelhouse --python $(NODE_VENV)/bin/python
	$(VENV)/bin/porter verify --python $(NODE_VENV)/bin/python

# Two or more pytest workers (at most 4): many integration tests wait on one compiler, pip or a child process at a
# time, so a second worker fills the idle core. A third on 2 cores was measured: no faster (the run is CPU-bound:
# the compiles; "most CPU" at the end of the run says how busy the cores were, and which tests cost the most), a
# worker costs CPU of its own: its session fixtures (a one-node Slurm on free
# ports included). --dist loadfile --no-loadscope-reorder: a worker is handed one whole test file at a time, in the
# collection's order (tests/conftest.py: the integration files with slow tests first, the unit tier's last), so a
# file's module fixtures are made once and the last file to start is a short one.
TEST_JOBS   ?= $(shell n=$$(nproc); [ $$n -lt 2 ] && n=2; [ $$n -gt 4 ] && n=4; echo $$n)

test: venv test-unit-no-torch
	$(PY) -m pytest -n $(TEST_JOBS) --dist loadfile --no-loadscope-reorder --durations=60 tests/unit tests/integration

# The unit tier must pass where torch is absent (what needs torch skips, with its reason).
NOTORCH_VENV ?= .venv-notorch
$(NOTORCH_VENV)/.stamp: pyproject.toml setup.py
	$(PYTHON) -m venv $(NOTORCH_VENV)
	$(NOTORCH_VENV)/bin/python -m pip install -q --upgrade pip
	$(NOTORCH_VENV)/bin/python -m pip install -q -e ".[test]"
	touch $@

notorch-venv: $(NOTORCH_VENV)/.stamp

test-unit-no-torch: $(NOTORCH_VENV)/.stamp
	@! $(NOTORCH_VENV)/bin/python -c "import torch" 2>/dev/null || { echo "$(NOTORCH_VENV) has torch"; exit 1; }
	$(NOTORCH_VENV)/bin/python -m pytest -q -n $(TEST_JOBS) tests/unit

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
TRIXIE_PACKAGES ?= hipcc libamdhip64-dev rocm-device-libs-17 g++ ccache librocthrust-dev libhipcub-dev \
                   libhipblas-dev libhipsparse-dev

chroot-trixie:
	@set -e; root="$(TRIXIE_ROOT)"; \
	if [ -x "$$root/usr/bin/hipcc" ] && chroot "$$root" dpkg -s $(TRIXIE_PACKAGES) >/dev/null 2>&1; then \
	  echo "trixie chroot already at $$root"; else \
	  command -v debootstrap >/dev/null 2>&1 || { apt-get update -qq; apt-get install -y -qq debootstrap; }; \
	  if [ ! -x "$$root/usr/bin/apt-get" ]; then mkdir -p "$$root"; \
	    debootstrap --variant=minbase trixie "$$root" >/dev/null; fi; \
	  chroot "$$root" apt-get update -qq; \
	  DEBIAN_FRONTEND=noninteractive chroot "$$root" apt-get install -y -qq $(TRIXIE_PACKAGES) >/dev/null; \
	  echo "trixie chroot ready at $$root"; fi

# A small node userspace to build images from (porter image's tests): Debian bookworm (Python 3.11), a venv at
# /opt/venv with the CPU torch this project tests against (its wheels fetched by this machine's pip, installed
# offline inside). Made once, reused when present.
IMAGE_BASE ?= /var/lib/porter/image-base

image-base:
	@set -e; root="$(IMAGE_BASE)"; \
	if [ -x "$$root/opt/venv/bin/python" ] && chroot "$$root" /opt/venv/bin/python -c "import torch" >/dev/null 2>&1; then \
	  echo "image base already at $$root"; else \
	  command -v debootstrap >/dev/null 2>&1 || { apt-get update -qq; apt-get install -y -qq debootstrap; }; \
	  if [ ! -x "$$root/usr/bin/apt-get" ]; then mkdir -p "$$root"; \
	    debootstrap --variant=minbase bookworm "$$root" >/dev/null; fi; \
	  cp /etc/resolv.conf "$$root/etc/resolv.conf"; \
	  chroot "$$root" apt-get update -qq; \
	  DEBIAN_FRONTEND=noninteractive chroot "$$root" apt-get install -y -qq python3 python3-venv >/dev/null; \
	  chroot "$$root" python3 -m venv /opt/venv; \
	  $(PYTHON) -m pip download -q --only-binary :all: -d "$$root/tmp/torch" "$(TORCH_CPU)"; \
	  chroot "$$root" /opt/venv/bin/python -m pip install -q --disable-pip-version-check --no-index \
	    --find-links /tmp/torch "$(TORCH_CPU)"; \
	  rm -rf "$$root/tmp/torch" "$$root/root/.cache/pip"; \
	  echo "image base ready at $$root"; fi

# ROCm 7.2 (hipcc 7, clang 22: gfx90a, gfx942, gfx950) from Debian experimental on top of sid, used
# through the debian-rocm7 profile's launcher. The experimental line reuses the mirror debootstrap wrote
# into the chroot's own sources.list. Release files of sid/experimental may be past Valid-Until on a
# snapshot mirror, hence Check-Valid-Until=false. hipcc 7 resolves its own path through /proc/self/exe,
# so /proc is mounted on every run (a reboot unmounts it), also when the chroot already exists.
ROCM7_APT      := apt-get -o Acquire::Check-Valid-Until=false
ROCM7_PACKAGES ?= hipcc libamdhip64-dev rocm-device-libs-21 g++ make librccl-dev libfabric-dev libhwloc-dev autoconf automake libtool libhipblaslt-dev librocblas-dev libhipsparse-dev libhipsolver-dev libhiprand-dev ccache \
                  libhipblas-dev librocthrust-dev libhipcub-dev rocminfo libmiopen-dev apptainer squashfs-tools libaio-dev

# sid_root ROOT,PACKAGES: debootstrap Debian sid at ROOT (unless there), mount its /proc, and install PACKAGES from
# experimental.
define sid_root
command -v debootstrap >/dev/null 2>&1 || { apt-get update -qq; apt-get install -y -qq debootstrap; }; \
if [ ! -f "$(1)/etc/apt/sources.list" ] || [ -d "$(1)/debootstrap" ]; then \
  mkdir -p "$(1)"; debootstrap --variant=minbase sid "$(1)" >/dev/null; fi; \
mirror=$$(awk '$$1 == "deb" && $$3 == "sid" { print $$2; exit }' "$(1)/etc/apt/sources.list"); \
[ -n "$$mirror" ] || { echo "no 'deb MIRROR sid' line in $(1)/etc/apt/sources.list" >&2; exit 1; }; \
echo "deb $$mirror experimental main" > "$(1)/etc/apt/sources.list.d/experimental.list"; \
[ -e "$(1)/proc/self" ] || mount -t proc proc "$(1)/proc"; \
chroot "$(1)" $(ROCM7_APT) update -qq; \
DEBIAN_FRONTEND=noninteractive chroot "$(1)" $(ROCM7_APT) install -y -qq -t experimental $(2) >/dev/null
endef

chroot-rocm7:
	@set -e; root="$(ROCM7_ROOT)"; \
	if [ -x "$$root/usr/bin/hipcc" ] && chroot "$$root" dpkg -s $(ROCM7_PACKAGES) >/dev/null 2>&1; then \
	  echo "sid ROCm 7 chroot already at $$root"; else \
	  $(call sid_root,$$root,$(ROCM7_PACKAGES)); \
	  echo "sid ROCm 7 chroot ready at $$root"; fi; \
	mountpoint -q "$$root" || mount --bind "$$root" "$$root"; \
	[ -e "$$root/proc/self" ] || mount -t proc proc "$$root/proc"

# The node side of the sid chroot, for images: ROCm 7.2's runtime (HIP, RCCL, libfabric; no compiler, no
# headers) and an empty venv at /opt/venv. What RCCL's network plugin needs to load, as on a node.
IMAGE_BASE_ROCM        ?= /var/lib/porter/image-base-rocm
ROCM_RUNTIME_PACKAGES  ?= --no-install-recommends librccl1 libamdhip64-7 libfabric1 python3 python3-venv

image-base-rocm:
	@set -e; root="$(IMAGE_BASE_ROCM)"; \
	if [ -x "$$root/opt/venv/bin/python" ] && chroot "$$root" dpkg -s librccl1 libfabric1 >/dev/null 2>&1; then \
	  echo "ROCm runtime image base already at $$root"; else \
	  $(call sid_root,$$root,$(ROCM_RUNTIME_PACKAGES)); \
	  chroot "$$root" python3 -m venv /opt/venv; \
	  chroot "$$root" apt-get clean; umount "$$root/proc"; \
	  echo "ROCm runtime image base ready at $$root"; fi

# torch alone first (gigabytes to unpack, and it touches nothing here), so .ci/run can install it while the other
# venvs install porter (editable installs write porter.egg-info here: one after the other).
$(CUDA_VENV)/.torch:
	$(PYTHON) -m venv $(CUDA_VENV)
	$(CUDA_VENV)/bin/python -m pip install -q "$(TORCH_CUDA)"
	touch $@

$(CUDA_VENV)/.stamp: pyproject.toml setup.py $(CUDA_VENV)/.torch
	$(CUDA_VENV)/bin/python -m pip install -q "$(TORCH_CUDA)" -e ".[test]"
	touch $@

cuda-torch: $(CUDA_VENV)/.torch

cuda-venv: $(CUDA_VENV)/.stamp

clean:
	rm -rf build dist *.egg-info wheelhouse .pytest_cache $(NODE_VENV)
