# make demo: set everything up, then run the main job on the embedded default.
# make test: set everything up, then run the linters and the test suite.
# Both work on a fresh Debian machine: missing system packages are installed with apt-get.

SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
SYSTEM_PACKAGES := fuse3 attr postgresql rsync restic ca-certificates
# OpenSSH's sftp client for the SFTP tests; its sftp-server is bench/sftp.py's peer (which
# also wants sshd from openssh-server: not installed here, since it would start a daemon)
SYSTEM_PACKAGES += openssh-client openssh-sftp-server
# The NFS and SMB edges: libnfs's command-line client, Samba (smbd, smbclient, smbtorture,
# and nss_wrapper for its users' accounts), the reference NFS server, and what the QEMU guest
# (a real Linux NFS/SMB client, loomfs.testing.guest) is built from
SYSTEM_PACKAGES += libnfs-utils samba smbclient samba-testsuite libnss-wrapper
SYSTEM_PACKAGES += nfs-ganesha nfs-ganesha-vfs rpcbind qemu-system-x86 busybox-static kmod iproute2
# the console's browser tests (Playwright drives Debian's chromium; no browser download)
SYSTEM_PACKAGES += chromium
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)
PYTEST_ARGS ?=

.PHONY: setup system demo test lint typecheck unit bench-quick clean

setup: system $(STAMP)

system:
	@missing=""; \
	for p in $(SYSTEM_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing system packages:$$missing"; \
	  sudo=""; [ "$$(id -u)" = 0 ] || sudo=sudo; \
	  guard=""; \
	  if [ ! -e /usr/sbin/policy-rc.d ]; then \
	    guard=/usr/sbin/policy-rc.d; \
	    printf '#!/bin/sh\nexit 101\n' | $$sudo tee $$guard >/dev/null && $$sudo chmod +x $$guard; \
	  fi; \
	  $$sudo apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$sudo apt-get -o DPkg::Lock::Timeout=300 install -y -qq \
	    --no-install-recommends $$missing; rc=$$?; \
	  [ -z "$$guard" ] || $$sudo rm -f $$guard; \
	  exit $$rc; \
	fi

$(STAMP): pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	@rm -f $(VENV)/.installed-*
	@touch $@

demo: setup
	$(PY) -m loomfs.demo

lint: setup
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/ruff format --check src tests bench

typecheck: setup
	$(VENV)/bin/mypy

unit: setup
	$(PY) -m pytest $(PYTEST_ARGS)

test: lint typecheck unit

# conformance suites other people wrote run from their own checkouts (docs/COMPATIBILITY.md);
# corpora.py is the corpus library the transfer benches share
NOT_BENCHES := bench/pjdfstest.py bench/pjdfstest_nfs.py bench/s3_tests_run.py bench/fsx.py \
  bench/smbtorture.py bench/corpora.py

bench-quick: setup
	@for b in $(filter-out $(NOT_BENCHES),$(wildcard bench/*.py)); do \
	  echo "== $$b"; $(PY) $$b --quick || exit 1; done

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .demo .bench
