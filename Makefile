# redis-mem: `make run` starts Redis with the module, `make test` runs every test.
# Both install what a fresh Debian machine is missing (redis-server, libclang-dev).

SO      := target/release/libredis_mem.so
SUDO    := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APT     := DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 $(SUDO) apt-get

.PHONY: deps build run test test-compat bench clean

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

# Unit tests (pure Rust), integration tests (real redis-server processes),
# then the Python client / LangChain / worker / migration tests (pytest, venv in target/).
test: build
	cargo test --release
	examples/python/run_tests.sh

# The integration tests once per server users run: Redis 7.0 (bookworm), Valkey 8.0
# (bookworm-backports .debs), Redis 8.0 and Valkey 8.1 (built from trixie's sources),
# fetched/built once into target/compat/ by tests/compat/servers.sh.
# COMPAT_SERVERS="redis-7.0 valkey-8.0" picks a subset.
test-compat: build
	tests/compat/run.sh

# Side-by-side benchmark (own redis-server, release build); writes docs/PERFORMANCE.md.
bench: build
	benches/run_bench.sh

clean:
	cargo clean
