# Spillway: `make demo` shows it working, `make test` runs every test. Both set up what they need.

CARGO ?= cargo
SPILLWAY := target/release/spillway

.PHONY: demo test deps build release test-rust test-python bench clean config-doc

demo: release
	$(SPILLWAY) demo

test: deps release
	$(CARGO) test --workspace --no-fail-fast
	SPILLWAY_BIN=$(CURDIR)/$(SPILLWAY) python/run-tests.sh

# System packages the tests need (Debian), installed only when missing.
deps:
	scripts/install-deps.sh

release:
	$(CARGO) build --release -p spillway

build:
	$(CARGO) build --workspace

# Every benchmark, each with its own baselines; see README.
bench: release
	$(SPILLWAY) bench store

config-doc: release
	$(SPILLWAY) config-doc > docs/reference/config.md

clean:
	$(CARGO) clean
