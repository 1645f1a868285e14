# Spillway: `make demo` shows it working, `make test` runs every check and test. Both set up
# what they need.

CARGO ?= cargo
# `make test` is mostly run once on a clean clone: incremental caches would only add gigabytes of
# disk and time. Set CARGO_INCREMENTAL=1 to keep them while iterating.
export CARGO_INCREMENTAL ?= 0
SPILLWAY := target/release/spillway
# The crates whose expensive invariant checks (`strict_assertions`) run in `make test`: the
# store (with its index) and the drain.
STRICT_FEATURES := spillway-store/strict_assertions,spillway-drain/strict_assertions

.PHONY: demo demo-cluster test deps build release deb lint test-rust test-strict test-python bench chaos clean config-doc

demo: release
	$(SPILLWAY) demo

# The same story on 4 hosts in Linux namespaces (root): servers on three, a compute node on the
# fourth, drained to a local directory; the cluster is torn down even on failure.
demo-cluster: release
	scripts/cluster/demo.sh $(SPILLWAY)

# Guardrails first (formatting, clippy with every warning an error, the repository checks of
# spillway-tidy run with the other tests), then every test, then the strict-assertion builds.
# No release build: the Python tests use the binary the Rust tests built (target/debug, the
# test profile, optimised), which saves a whole-workspace compile (about 7 of CI's minutes).
test: deps lint test-rust test-strict test-python

# System packages and toolchain components the tests need, installed only when missing.
deps:
	scripts/install-deps.sh

lint:
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

release:
	$(CARGO) build --release -p spillway -p spillway-preload

build:
	$(CARGO) build --workspace

# The Debian package (cargo-deb), in target/debian/; crates/cli/tests/package_deb.rs installs one
# into a clean Debian root.
deb: release
	scripts/package/deb.sh $(SPILLWAY)

# SPILLWAY_BIN: the binary this very build made for the spillway package's tests, for the C
# example's tests (crates/capi/tests/c_example.rs), which would otherwise build one more with
# the capi package's features alone (about a minute).
test-rust:
	SPILLWAY_BIN=$(CURDIR)/target/debug/spillway $(CARGO) test --workspace --no-fail-fast

test-strict:
	$(CARGO) test -p spillway-store -p spillway-drain --features $(STRICT_FEATURES) --no-fail-fast

# The binary `test-rust` (or `cargo build`) left in target/debug; `make test` runs test-rust first.
test-python:
	SPILLWAY_BIN=$(CURDIR)/target/debug/spillway python/run-tests.sh

# The fault-injection runner (servers, mounts, the manager, drains and stage-out) with a longer
# budget than `make test` gives it (40 s); prints its seed, and SPILLWAY_CHAOS_SEED=<seed>
# replays it (SPILLWAY_CHAOS_FAULTS=<Fault,...> runs only those; crates/cli/tests/chaos.rs).
CHAOS_BUDGET_S ?= 600
chaos: deps
	SPILLWAY_CHAOS_BUDGET_S=$(CHAOS_BUDGET_S) $(CARGO) test -p spillway --test chaos -- --nocapture

# Every benchmark, each with its own baselines; see README.
bench: release
	$(SPILLWAY) bench store

config-doc: release
	$(SPILLWAY) config-doc > docs/reference/config.md

clean:
	$(CARGO) clean
