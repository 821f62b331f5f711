# redis-mem: `make run` starts Redis with the module, `make test` runs every test.
# Both install what a fresh Debian machine is missing (redis-server, libclang-dev;
# `make test` also chromium and chromium-driver for the browser test).

SO      := target/release/libredis_mem.so
SUDO    := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APT     := DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 $(SUDO) apt-get

.PHONY: deps build run test test-compat bench density instructions holds clean redis-suite

# RUNLEVEL=1 keeps Debian from starting its own redis-server service on 6379.
deps:
	@missing=""; \
	command -v redis-server >/dev/null 2>&1 || missing="$$missing redis-server"; \
	dpkg -s libclang-dev >/dev/null 2>&1 || missing="$$missing libclang-dev"; \
	command -v python3 >/dev/null 2>&1 || missing="$$missing python3"; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  $(APT) update -qq && $(APT) install -y -qq $$missing; \
	fi

build: deps
	cargo build --release

run: build
	redis-server redis.conf.example

# Unit tests (pure Rust); then the integration tests (real servers) on every
# server users run — Debian bookworm's Redis 7.0.15, and (test-compat's servers,
# built or fetched once into ~/.cache/redis-mem/compat/) Valkey 8.0.1, Redis 8.0.2,
# Valkey 8.1.1 — TEST_JOBS of them at once; beside them the redis-mem Python package
# (installed into the venv target/venv) and its tests, then token counts against the
# vendors' own tokenizers (tests/oracle, PyPI, venv in target/): those wait on their
# servers more than they compute. TEST_COMPAT= (empty) runs Redis 7.0 only. Last, the
# TypeScript package's type check and tests (js/, `npm ci` from its lockfile).
TEST_COMPAT ?= valkey-8.0 redis-8.0 valkey-8.1
TEST_JOBS ?= 4
test: build
	@# The Python suite's browser test drives Debian's headless Chromium; installed
	@# here, before the servers' tests run beside the Python ones (one apt at a time).
	@command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1 || \
	  { $(APT) update -qq && $(APT) install -y -qq chromium chromium-driver; }
	@# The TypeScript package's tests (js/) need node and npm: Debian's when missing.
	@command -v npm >/dev/null 2>&1 || { $(APT) update -qq && $(APT) install -y -qq nodejs npm; }
	@cargo fmt --version >/dev/null 2>&1 || rustup component add rustfmt
	@cargo clippy --version >/dev/null 2>&1 || rustup component add clippy
	cargo fmt --check
	cargo clippy --release --all-targets -- -D warnings
	cargo test --release --no-run
	cargo test --release --lib
	@mkdir -p target; \
	( python/run_tests.sh && tests/oracle/run.sh ) >target/python-tests.log 2>&1 & py=$$!; \
	COMPAT_PARALLEL=$(TEST_JOBS) COMPAT_SERVERS="redis-7.0 $(TEST_COMPAT)" tests/compat/run.sh; it=$$?; \
	wait $$py; pyrc=$$?; \
	echo "==== the Python package's tests and the oracles (target/python-tests.log):"; \
	cat target/python-tests.log; \
	cat target/compat/logs/summary.txt 2>/dev/null; \
	[ $$it -eq 0 ] && [ $$pyrc -eq 0 ]
	@# The TypeScript package (js/): tsc --noEmit strict, then its tests (node's test
	@# runner) on node-redis RESP2/RESP3 and ioredis against a redis-server with $(SO).
	@# Its cross-language tests run the Python package from the venv the Python tests made.
	cd js && npm ci --no-audit --no-fund && REDIS_MEM_MODULE=$(abspath $(SO)) \
	  REDIS_MEM_PYTHON=$${REDIS_MEM_VENV:-$(CURDIR)/target/venv}/bin/python REDIS_MEM_REQUIRE_PYTHON=1 npm test

# The integration tests once per server users run: Redis 7.0 (bookworm), Valkey 8.0
# (bookworm-backports .debs), Redis 8.0 and Valkey 8.1 (built from trixie's sources),
# fetched/built once into ~/.cache/redis-mem/compat/ by tests/compat/servers.sh.
# COMPAT_SERVERS="redis-7.0 valkey-8.0" picks a subset.
test-compat: build
	COMPAT_PARALLEL=$(TEST_JOBS) tests/compat/run.sh

# Side-by-side benchmark (own redis-server, release build); writes docs/PERFORMANCE.md.
bench: build
	benches/run_bench.sh

# The many-sessions comparison (100,000 sessions of 30 x 200 B / 600 B: redis-mem vs
# a list vs the seed's JSON string; used_memory, MEMORY USAGE, RDB bytes, SAVE, DEBUG
# RELOAD) and per-command server CPU at 30 / 1,000 / 10,000 messages: benches/density.py,
# part of `make bench` too; 6-10 minutes by the load, writes its section of docs/PERFORMANCE.md.
# With DENSITY_ARGS it only prints (add --out docs/PERFORMANCE.md to write); the quick
# memory-only loop: make density DENSITY_ARGS="--memory-only --sizes 200 --sessions 20000 --runs 1"
density: build
	benches/run_bench.sh --density-only $(DENSITY_ARGS)

# Instructions and cache misses a command costs in the server, counted by valgrind's
# cachegrind rather than timed (times here move 10-30% by the hour): cold MEM.COUNT
# of part 8's 600 B messages and XADD of the same bytes, per command; with
# INSTRUCTIONS_ARGS="--against other.so" two builds side by side. benches/instructions.py.
instructions: build
	@command -v valgrind >/dev/null 2>&1 || { $(APT) update -qq && $(APT) install -y -qq valgrind; }
	benches/run_bench.sh --instructions-only $(INSTRUCTIONS_ARGS)

clean:
	cargo clean

# Measurement: the longest main-thread hold of any MEM.* command over the whole
# test suite (from each test server's SLOWLOG) and over the hostile set of
# benches/holds.py (4x the sizes of the stall findings), with PING latency,
# threads and memory; run on a quiet machine. Writes a section of docs/PERFORMANCE.md.
holds: build
	rm -f target/holds-suite.txt
	REDIS_MEM_HOLDS=$(CURDIR)/target/holds-suite.txt cargo test --release --test it -- --test-threads 1 >/dev/null 2>&1 || true
	@echo "test suite: MEM.* commands holding the main thread >= 1 ms, longest first:"
	@sort -rn target/holds-suite.txt | head -15
	target/venv/bin/python benches/holds.py --module target/release/libredis_mem.so --suite target/holds-suite.txt --out docs/PERFORMANCE.md

# Redis's own test suite (tests/ of the Redis 8.0.2 source test-compat fetches) over
# the units of issue 18 (types, keyspace, dump, expire, info, introspection, maxmemory,
# lazyfree, multi, scripting, other, latency-monitor, memefficiency, acl, pubsub, rdb,
# aof, replication, shutdown, slowlog, functions), once plain and once with
# `--config loadmodule target/release/libredis_mem.so`: fails if a test fails only with
# the module. Not part of `make test`: about 20 min for both runs on 2 cores, plus a
# rerun of any unit with a module-only failure (docs/RELIABILITY.md).
# REDIS_SUITE_JOBS=2 runs fewer units at once; `tests/redis_suite/run.sh unit/dump` one unit.
redis-suite: build
	tests/redis_suite/run.sh
