# Fresh machine (Debian, root, Docker running):  make demo   |   make test
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
APT_PACKAGES := mmdebstrap debian-archive-keyring docker-registry curl openssh-client openssh-server rsync sudo \
  qemu-user-static binfmt-support skopeo chromium
DEMO_CELL ?= cu121-torch2.1.2-py3.11-tf4.48.2
MUTATION_JOBS ?= 2
# Python may cache bytecode here (git ignores __pycache__): with PYTHONDONTWRITEBYTECODE set, as some CI images set
# it, every imagekit process and every test collection compiles everything again (a third of the fast tier's time).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup registry demo pod test test-fast test-changed test-arm64 test-images test-cuda-toolkit lint bench mutation

setup: $(VENV)/.installed
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; fi
	tools/install-buildx >/dev/null
	@tools/enable-arm64-emulation 2>/dev/null || echo "warning: linux/arm64 images cannot be built here (tools/enable-arm64-emulation failed; run it as root)"

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@echo "installing imagekit and its test tools into $(VENV) (a minute or two)"
	set -o pipefail; $(PY) -m pip install --progress-bar off -e '.[test,pip-tools]' | { grep -E '^(Collecting|Successfully)' || true; }
	touch $@

registry: setup
	tools/local-registry

# The main job on the embedded defaults: default matrix, locally bootstrapped base, local registry.
# Its last line: the time by step (setup and registry, then the build's own steps, then the template and the doctor).
demo:
	@t0=$$(date +%s); $(MAKE) --no-print-directory registry && t1=$$(date +%s) && \
	$(PY) tools/demo-key .imagekit/demo-cosign.key >/dev/null && \
	$(VENV)/bin/imagekit build --cell $(DEMO_CELL) --push --registry 127.0.0.1:5000/imagekit/train \
	  --sign-key .imagekit/demo-cosign.key && t2=$$(date +%s) && \
	$(VENV)/bin/imagekit verify 127.0.0.1:5000/imagekit/train:$(DEMO_CELL) --key .imagekit/demo-cosign.pub && \
	$(VENV)/bin/imagekit runpod-template $(DEMO_CELL) && \
	docker run --rm 127.0.0.1:5000/imagekit/train:$(DEMO_CELL) python /opt/imagekit/doctor/imagekit_doctor.py --tier standard && \
	t3=$$(date +%s) && echo "make demo: $$((t3 - t0)) s: setup and registry $$((t1 - t0)) s, imagekit build $$((t2 - t1)) s" \
	  "(its time by step above), signature check, template and doctor $$((t3 - t2)) s"

# The demo image started as a pod platform starts it: detached, your SSH key as PUBLIC_KEY, a volume on /workspace.
pod:
	docker rm -f imagekit-pod >/dev/null 2>&1 || true
	mkdir -p .imagekit/workspace
	docker run -d --name imagekit-pod -p 127.0.0.1:2222:22 -v "$$PWD/.imagekit/workspace:/workspace" \
	  -e PUBLIC_KEY="$$(cat $$HOME/.ssh/*.pub 2>/dev/null)" 127.0.0.1:5000/imagekit/train:$(DEMO_CELL) >/dev/null
	@echo "started imagekit-pod:  ssh root@127.0.0.1 -p 2222  |  docker logs imagekit-pod  |  docker rm -f imagekit-pod"

# Everything (what CI runs: .ci/run), as three processes side by side, each report printed, any failing fails the
# target: the Docker tests that use the session's real torch image (its build first, then the guard's and the pods'
# tests, which mostly wait on their windows), the other Docker tests (their own small images, on the same engine), and
# the tests that need only Python, real sshd, real resolvers and loopback servers (a file's tests on one worker, in
# order). The real image's process is the longest and its guard tests time windows, so the others run at lower CPU
# priorities (nice 5 and 10): they take the cores that process leaves while its tests wait.
test: setup
	@rm -f .test-*.log .test-*.rc; \
	( nice -n 10 $(PY) -m pytest -q -n 2 --dist loadfile -m "not sweep and not docker and not images" --durations=10 >.test-python.log 2>&1; \
	  echo $$? >.test-python.rc ) & \
	( nice -n 5 $(PY) -m pytest -q -m "not sweep and not emulated and not images and docker and not real_image" --durations=10 >.test-docker.log 2>&1; \
	  echo $$? >.test-docker.rc ) & \
	$(PY) -m pytest -q -m "not sweep and not emulated and not images and docker and real_image" --durations=10; real=$$?; \
	wait; echo "---- the other Docker tests (run beside them) ----"; cat .test-docker.log; \
	echo "---- the tests without Docker (run beside them) ----"; cat .test-python.log; \
	docker=$$(cat .test-docker.rc); python=$$(cat .test-python.rc); rm -f .test-*.log .test-*.rc; \
	echo "tests without Docker: exit $$python; other Docker tests: exit $$docker; real image's tests: exit $$real"; \
	[ "$$real" = 0 ] && [ "$$docker" = 0 ] && [ "$$python" = 0 ]

# The torch 2.15 cell built for linux/arm64 on this host, under qemu from the base up (tens of minutes on two cores;
# `make test` runs the same path on busybox images): docs/builds.md, "linux/arm64 images".
test-arm64: setup
	$(PY) -m pytest -q -s -m emulated tests/test_arm64_image.py

# The further real torch images (marker `images`, not in `make test`: it stays under 20 minutes): `[image] cuda_toolkit`
# on CUDA 11.8 (bookworm) and 12.4 (trixie) cells, two images with Debian's CUDA compiler, built and their kernels
# compiled (1.6-2 GB of .debs each: docs/builds.md, "A CUDA compiler"); the torch 2.1.2 cell with only tensorboard held
# to numpy 1 and a setuptools with pkg_resources by the companions table, built and self-tested; the torch cell again
# through buildx, the base bootstrapped again by a sudo user, two cells sharing CUDA layers and a second seeds case.
test-images: setup
	$(PY) -m pytest -q -s -m images

test-cuda-toolkit: setup
	$(PY) -m pytest -q -s -m images tests/test_cuda_toolkit_image.py

# What needs only Python in this process (no server, no program started), in parallel: under half a minute on two
# cores. After each change.
FAST := not sweep and not docker and not sshd and not resolver and not network and not slow and not loopback and not programs and not seconds
test-fast: $(VENV)/.installed
	IMAGEKIT_FAST_TIER=1 $(PY) -m pytest -q -n 2 --dist loadfile -m "$(FAST)" -p no:cacheprovider

# The tests of the packages a change touches (uncommitted, or since BASE=REV): tests/<package>/ for each
# imagekit/<package>/ changed, the changed tests themselves, and the layering checks; every tier but Docker, sshd and
# the network. `make test-changed BASE=main~3`
test-changed: $(VENV)/.installed
	@tests=$$($(PY) tools/changed-tests $(if $(BASE),--base $(BASE))); echo "tests: $$tests"; \
	$(PY) -m pytest -q -n 2 --dist loadfile -m "not sweep and not docker and not sshd and not network and not slow" \
	  -p no:cacheprovider $$tests

lint: setup
	$(VENV)/bin/ruff check imagekit tests bench && $(VENV)/bin/ruff format --check imagekit tests bench

bench: setup
	$(PY) bench/explain_render.py && $(PY) bench/lock.py && $(PY) bench/doctor.py

# Mutation testing of the core that decides what a tag means (minutes; not part of `make test`). docs/mutation.md
mutation: setup
	$(PY) -m pip install -q -e '.[mutation]'
	rm -rf mutants
	$(VENV)/bin/mutmut run --max-children $(MUTATION_JOBS)
	$(PY) tools/mutation_score.py
