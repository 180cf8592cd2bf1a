#!/usr/bin/env bash
# Installs a Concord build into a temporary prefix and uses it as a user would:
#   1. cmake --install BUILD --prefix TMP
#   2. the CMake consumer (tests/install/consumer: find_package(Concord CONFIG), Concord::concord)
#      configured with CMAKE_PREFIX_PATH=TMP, built and run (C and C++)
#   3. the same C program built with `cc $(pkg-config --cflags --libs concord)` from
#      PKG_CONFIG_PATH=TMP/lib/pkgconfig, and run
#   4. nm -D: libconcord exports only concord_* symbols
# Usage: run_install_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail

src="${1:?usage: run_install_test.sh SOURCE_DIR BUILD_DIR}"
build="${2:?usage: run_install_test.sh SOURCE_DIR BUILD_DIR}"
src="$(cd "$src" && pwd)"
build="$(cd "$build" && pwd)"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/concord-install-test.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
prefix="$tmp/prefix"
step() { echo "--- $*"; }
fail() { echo "run_install_test.sh: FAIL: $*" >&2; exit 1; }

# The library must be built (ctest does not build); build only what the install needs.
step "building concord in $build"
cmake --build "$build" --target concord -j2 >/dev/null

step "cmake --install $build --prefix $prefix"
# Install only the library's component-less rules; the launcher is installed too when built.
cmake --install "$build" --prefix "$prefix" >"$tmp/install.log" 2>&1 || {
  cat "$tmp/install.log"; fail "cmake --install failed"; }
libdir="$(dirname "$(find "$prefix" -name 'libconcord.so' -print -quit)")"
[[ -n "$libdir" && -e "$libdir/libconcord.so" ]] || fail "no libconcord.so under $prefix"
[[ -f "$prefix/include/concord/concord.h" ]] || fail "concord.h not installed"
[[ -f "$prefix/include/concord/concord.hpp" ]] || fail "concord.hpp not installed"
pcdir="$(dirname "$(find "$prefix" -name 'concord.pc' -print -quit)")"
[[ -f "$pcdir/concord.pc" ]] || fail "concord.pc not installed"
echo "libdir $libdir, pkg-config dir $pcdir"

step "CMake consumer: find_package(Concord CONFIG REQUIRED)"
cmake -S "$src/tests/install/consumer" -B "$tmp/consumer" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_BUILD_TYPE=Release >"$tmp/consumer.log" 2>&1 || {
  cat "$tmp/consumer.log"; fail "configuring the consumer failed"; }
cmake --build "$tmp/consumer" -j2 >>"$tmp/consumer.log" 2>&1 || {
  cat "$tmp/consumer.log"; fail "building the consumer failed"; }
# The consumer must use the installed headers, not the source tree's.
if grep -rq -- "$src/include" "$tmp/consumer/CMakeFiles" 2>/dev/null; then
  fail "the consumer was compiled against the source tree's headers"
fi
env -u CONCORD_RANK -u CONCORD_SIZE -u CONCORD_STORE LD_LIBRARY_PATH="$libdir" \
  timeout 30 "$tmp/consumer/consumer_c"
env -u CONCORD_RANK -u CONCORD_SIZE -u CONCORD_STORE LD_LIBRARY_PATH="$libdir" \
  timeout 30 "$tmp/consumer/consumer_cpp"

step "pkg-config consumer"
export PKG_CONFIG_PATH="$pcdir"
flags="$(pkg-config --cflags --libs concord)" || fail "pkg-config does not know concord"
echo "pkg-config --cflags --libs concord: $flags"
# shellcheck disable=SC2086
cc -std=c99 -Wall -Wextra -pedantic -Werror -o "$tmp/consumer_pc" \
  "$src/tests/install/consumer/main.c" $flags || fail "building with pkg-config's flags failed"
env -u CONCORD_RANK -u CONCORD_SIZE -u CONCORD_STORE LD_LIBRARY_PATH="$libdir" \
  timeout 30 "$tmp/consumer_pc"

step "exported symbols"
lib="$(readlink -f "$libdir/libconcord.so")"
nm -D --defined-only "$lib" | awk '{print $NF}' | sed 's/@.*//' | sort -u >"$tmp/symbols"
echo "$(wc -l <"$tmp/symbols") defined dynamic symbols"
bad="$(grep -v '^concord_' "$tmp/symbols" | grep -v '^CONCORD_0$' || true)"
if [[ -n "$bad" ]]; then
  echo "$bad" | head -20
  fail "libconcord exports symbols other than concord_* ($(echo "$bad" | wc -l))"
fi
for sym in concord_init concord_init_config concord_finalize concord_allreduce_async \
  concord_allgather_async concord_broadcast_async concord_barrier_async concord_wait \
  concord_test concord_request_free concord_status_string concord_version; do
  grep -qx "$sym" "$tmp/symbols" || fail "$sym is not exported"
done
echo "run_install_test.sh: PASS"
