#!/usr/bin/env bash
# The servers `make test-compat` runs the integration tests against, fetched
# or built from Debian's archive into the user's cache,
# ~/.cache/redis-mem/compat/ (nothing installed system-wide, no service
# started). Idempotent: a second run, from this clone or another, finds the
# cached binaries and touches no network.
#
#   tests/compat/servers.sh [NAME...]     NAME: redis-7.0 valkey-8.0 redis-8.0 valkey-8.1
#
# Prints one line per server on stdout, tab-separated:
#   name  version  server-binary  cli-binary
# Progress and timings go to stderr.
#
# Where each server comes from:
#   redis-7.0   Debian bookworm's redis-server/redis-cli (the system's; `make deps`)
#   valkey-8.0  bookworm-backports valkey-server + valkey-tools .debs, dpkg-deb -x
#   redis-8.0   trixie's redis source package: orig tarball, plain `make`
#   valkey-8.1  trixie's valkey source package: orig tarball, plain `make`
#
# Backports and trixie are reached through a private apt configuration in
# ~/.cache/redis-mem/compat/apt/ (its own sources file, lists and caches) on the mirror
# of the machine's own bookworm source: the machine's apt setup is untouched.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
# REDIS_MEM_COMPAT_DIR: where the servers are cached. By default in the user's
# cache, as cargo keeps crates in ~/.cargo: a fresh clone reuses the two
# builds from trixie's sources (~4 min on 2 cores) instead of repeating them.
# Each server sits in a directory named by its exact version.
OUT="${REDIS_MEM_COMPAT_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/redis-mem/compat}"
APTDIR="$OUT/apt"
DL="$OUT/downloads"
JOBS="${COMPAT_JOBS:-2}"

# Pinned versions. Backports: the exact Debian version. Trixie: the upstream
# version (the Debian revision of a stable release moves with its point
# releases; the orig tarball, which is all we build, does not).
VALKEY80_DEB="8.0.1+dfsg1-1~bpo12+1"
REDIS80_UPSTREAM="8.0.2"
VALKEY81_UPSTREAM="8.1.1"

ALL=(redis-7.0 valkey-8.0 redis-8.0 valkey-8.1)

log() { echo "compat-servers: $*" >&2; }
die() { log "error: $*"; exit 1; }

SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo

# ---------------------------------------------------------------- the mirror

# The URI and keyring of the machine's own bookworm (main suite) source,
# from deb822 .sources files or one-line sources.list entries.
machine_mirror() {
    local f
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -r "$f" ] || continue
        # One stanza per paragraph; print "URI KEYRING" of the first stanza
        # whose Types has deb and whose Suites has bookworm.
        awk '
            function flush() {
                if (types ~ /(^| )deb( |$)/ && suites ~ /(^| )bookworm( |$)/ && uri != "" && !done) {
                    print uri, (key == "" ? "-" : key); done = 1
                }
                types = suites = uri = key = ""
            }
            /^[ \t]*$/ { flush(); next }
            /^#/ { next }
            tolower($1) == "types:"     { $1 = ""; types = $0 }
            tolower($1) == "suites:"    { $1 = ""; suites = $0 }
            tolower($1) == "uris:"      { uri = $2 }
            tolower($1) == "signed-by:" { key = $2 }
            END { flush() }
        ' "$f"
    done | head -n1 | grep . && return 0
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -r "$f" ] || continue
        sed -E 's/\[[^]]*\]//' "$f" | awk '$1 == "deb" && $3 == "bookworm" { print $2, "-"; exit }'
    done | head -n1 | grep . && return 0
    return 1
}

APT_OPTS=()
apt_setup() {
    [ ${#APT_OPTS[@]} -gt 0 ] && return 0
    local line uri key
    line="$(machine_mirror)" || die "no bookworm source in /etc/apt/sources.list{,.d/}: cannot derive the mirror"
    uri="${line% *}"
    key="${line#* }"
    # (An inline key block, or none: Debian's keyring.)
    case "$key" in /*) ;; *) key=/usr/share/keyrings/debian-archive-keyring.gpg ;; esac
    mkdir -p "$APTDIR/etc/empty.d" "$APTDIR/lists/partial" "$APTDIR/cache/archives/partial"
    # Rewritten each time (cheap): follows the machine if its mirror changes.
    cat >"$APTDIR/etc/sources.list.new" <<EOF
# Written by tests/compat/servers.sh; used only with its private apt options.
deb [signed-by=$key] $uri bookworm-backports main
deb-src [signed-by=$key] $uri trixie main
EOF
    if ! cmp -s "$APTDIR/etc/sources.list.new" "$APTDIR/etc/sources.list" 2>/dev/null; then
        mv "$APTDIR/etc/sources.list.new" "$APTDIR/etc/sources.list"
        rm -f "$APTDIR/updated"
    else
        rm -f "$APTDIR/etc/sources.list.new"
    fi
    APT_OPTS=(
        -o "Dir::Etc::sourcelist=$APTDIR/etc/sources.list"
        -o "Dir::Etc::sourceparts=$APTDIR/etc/empty.d"
        -o "Dir::Etc::preferencesparts=$APTDIR/etc/empty.d"
        -o "Dir::State::Lists=$APTDIR/lists"
        -o "Dir::Cache=$APTDIR/cache"
        -o "APT::Sandbox::User=root"
    )
    log "mirror $uri (from the machine's bookworm source)"
}

# apt-get update of the private lists, once (again after a day, or when the
# sources file changed).
apt_update() {
    apt_setup
    if [ -e "$APTDIR/updated" ] && [ -z "$(find "$APTDIR/updated" -mmin +1440)" ]; then
        return 0
    fi
    log "apt-get update (private lists: bookworm-backports, trixie deb-src)"
    apt-get "${APT_OPTS[@]}" -qq update >&2 || die "apt-get update failed"
    touch "$APTDIR/updated"
}

# -------------------------------------------------------------- the servers

now() { date +%s.%N; }
took() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f s", b - a }'; }

# Shared libraries a binary needs that the machine lacks.
missing_libs() { ldd "$1" 2>/dev/null | awk '/not found/ { print $1 }'; }

server_redis70() {
    local bin cli ver
    bin="$(command -v redis-server)" || die "redis-server not installed (make deps installs it)"
    cli="$(command -v redis-cli)" || die "redis-cli not installed (make deps installs it)"
    ver="$("$bin" --version | sed -E 's/.* v=([^ ]+).*/\1/')"
    case "$ver" in 7.0.*) ;; *) log "warning: system redis-server is $ver, not 7.0.x" ;; esac
    printf 'redis-7.0\t%s\t%s\t%s\n' "$ver" "$bin" "$cli"
}

server_valkey80() {
    local dir="$OUT/valkey-8.0" t0 stage
    if [ "$(cat "$dir/.version" 2>/dev/null)" != "$VALKEY80_DEB" ]; then
        t0="$(now)"
        apt_update
        apt-cache "${APT_OPTS[@]}" show "valkey-server=$VALKEY80_DEB" >/dev/null 2>&1 \
            || die "bookworm-backports has no valkey-server $VALKEY80_DEB: $(apt-cache "${APT_OPTS[@]}" policy valkey-server | grep Candidate)"
        mkdir -p "$DL"
        (cd "$DL" && apt-get "${APT_OPTS[@]}" -qq download \
            "valkey-server=$VALKEY80_DEB" "valkey-tools=$VALKEY80_DEB") >&2 || die "apt-get download valkey failed"
        stage="$(mktemp -d "$OUT/.valkey-8.0.XXXXXX")"
        local deb
        for deb in "$DL/valkey-server_${VALKEY80_DEB}"_*.deb "$DL/valkey-tools_${VALKEY80_DEB}"_*.deb; do
            dpkg-deb -x "$deb" "$stage"
        done
        echo "$VALKEY80_DEB" >"$stage/.version"
        rm -rf "$dir"
        mv "$stage" "$dir"
        log "valkey-8.0: downloaded and extracted $VALKEY80_DEB in $(took "$t0")"
    fi
    local bin="$dir/usr/bin/valkey-server" cli="$dir/usr/bin/valkey-cli"
    # Runtime libraries of the .debs (libjemalloc2, liblzf1, ...) are the
    # same as bookworm's redis-server's, which `make deps` installs.
    local libs
    libs="$(missing_libs "$bin"; missing_libs "$cli")"
    [ -z "$libs" ] || die "valkey-8.0 needs libraries this machine lacks: $libs (apt-get install libjemalloc2 liblzf1)"
    printf 'valkey-8.0\t%s\t%s\t%s\n' "$("$bin" --version | sed -E 's/.* v=([^ ]+).*/\1/')" "$bin" "$cli"
}

# A C/C++ toolchain and make (Redis 8's deps/fast_float is C++); nothing else:
# BUILD_TLS=no and USE_SYSTEMD=no need neither libssl-dev nor pkg-config.
ensure_build_tools() {
    command -v make >/dev/null && command -v cc >/dev/null && command -v c++ >/dev/null && return 0
    log "installing build-essential (make, gcc, g++) from the machine's apt sources"
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get -qq update >&2
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get -qq install -y build-essential >&2
}

# The newest trixie version of source package $1 whose upstream version is $2.
trixie_source_version() {
    apt-cache "${APT_OPTS[@]}" showsrc "$1" 2>/dev/null | awk -v up="$2" '
        /^Package: / { pkg = $2 }
        /^Version: / && pkg == "'"$1"'" { v = $2; u = v; sub(/^[0-9]+:/, "", u); sub(/-[^-]*$/, "", u); sub(/\+dfsg[0-9]*$/, "", u); if (u == up) print v }
    ' | sort -V | tail -n1
}

# Builds trixie's source package $1 (upstream $2) into $OUT/$3 with binaries
# $4-server and $4-cli.
server_from_source() {
    local pkg="$1" upstream="$2" name="$3" prog="$4"
    local dir="$OUT/$prog-$upstream" t0 ver tarball
    if [ ! -x "$dir/bin/$prog-server" ] || [ ! -x "$dir/bin/$prog-cli" ]; then
        t0="$(now)"
        apt_update
        ver="$(trixie_source_version "$pkg" "$upstream")"
        [ -n "$ver" ] || die "trixie has no $pkg $upstream source: $(apt-cache "${APT_OPTS[@]}" showsrc "$pkg" | grep '^Version:' | tr '\n' ' ')"
        mkdir -p "$DL"
        # --tar-only: the orig tarball is what we build (the .dsc and the
        # debian/ tarball are not needed, and the mirror may lack them).
        (cd "$DL" && apt-get "${APT_OPTS[@]}" -qq source --download-only --tar-only "$pkg=$ver") >&2 \
            || die "apt-get source $pkg=$ver failed"
        local tars=("$DL/${pkg}_${upstream}"*.orig.tar.*)
        tarball="${tars[0]}"
        [ -e "$tarball" ] || die "apt-get source left no ${pkg}_${upstream}*.orig.tar.* in $DL"
        log "$name: $pkg $ver from trixie, building $(basename "$tarball") (make -j$JOBS BUILD_TLS=no)"
        ensure_build_tools
        local build="$OUT/build/$prog-$upstream"
        rm -rf "$build"
        mkdir -p "$build"
        tar -xf "$tarball" -C "$build" --strip-components=1
        rm -f "$build.failed"
        {
            TIMEFORMAT='%R s (CPU: %U s user, %S s sys)'
            time make -C "$build" -j"$JOBS" BUILD_TLS=no USE_SYSTEMD=no >"$build.make.log" 2>&1 || touch "$build.failed"
        } 2>"$build.time"
        if [ -e "$build.failed" ]; then
            tail -n 40 "$build.make.log" >&2
            die "$name: make failed (log: $build.make.log)"
        fi
        log "$name: make -j$JOBS took $(cat "$build.time"), load average $(cut -d' ' -f1-3 /proc/loadavg)"
        local stage
        stage="$(mktemp -d "$OUT/.$prog-$upstream.XXXXXX")"
        mkdir -p "$stage/bin"
        cp "$build/src/$prog-server" "$build/src/$prog-cli" "$stage/bin/"
        echo "$ver" >"$stage/.debian-version"
        rm -rf "$dir"
        mv "$stage" "$dir"
        rm -rf "$build"
        log "$name: fetched and built in $(took "$t0")"
    fi
    local bin="$dir/bin/$prog-server"
    printf '%s\t%s\t%s\t%s\n' "$name" "$("$bin" --version | sed -E 's/.* v=([^ ]+).*/\1/')" "$bin" "$dir/bin/$prog-cli"
}

one() {
    case "$1" in
        redis-7.0) server_redis70 ;;
        valkey-8.0) server_valkey80 ;;
        redis-8.0) server_from_source redis "$REDIS80_UPSTREAM" redis-8.0 redis ;;
        valkey-8.1) server_from_source valkey "$VALKEY81_UPSTREAM" valkey-8.1 valkey ;;
        *) die "unknown server $1 (one of: ${ALL[*]})" ;;
    esac
}

mkdir -p "$OUT"
# One fetch/build at a time (two `make test-compat` in one work tree).
exec 9>"$OUT/.lock"
flock 9

[ $# -gt 0 ] || set -- "${ALL[@]}"
for s in "$@"; do one "$s"; done
