#!/usr/bin/env bash
# Installs a Concord build into a temporary prefix and uses it as a user would:
#   1. cmake --install BUILD --prefix TMP
#   2. the CMake consumer (tests/install/consumer: find_package(Concord CONFIG), Concord::concord)
#      configured with CMAKE_PREFIX_PATH=TMP, built and run (C and C++)
#   3. the same C program built with `cc $(pkg-config --cflags --libs concord)` from
#      PKG_CONFIG_PATH=TMP/lib/pkgconfig, and run
#   4. concord.hpp compiled as C++14: one error, its own "needs C++17", first (for the consumer
#      too) and only (for the header alone)
#   5. concord.pc with other library and header directories: the source configured again (only
#      configured: the library and concordrun built in BUILD are copied into that tree, as it
#      would build them) with CMAKE_INSTALL_LIBDIR=lib/x86_64-linux-gnu (as Debian's
#      GNUInstallDirs), installed, then moved elsewhere; with an absolute libdir; with lib64 and an
#      absolute includedir.
#      Each time pkg-config's -I and -L paths exist and the C consumer builds with them and runs
#   6. nm -D: libconcord exports only concord_* symbols
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
step "building concord and concordrun in $build"
cmake --build "$build" --target concord concordrun -j2 >/dev/null

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

step "C++14: concord.hpp gives one error, naming C++17"
printf '#include <concord/concord.hpp>\nint main() { return 0; }\n' >"$tmp/cxx14.cpp"
for file in "$tmp/cxx14.cpp" "$src/tests/install/consumer/main.cpp"; do
  if c++ -std=c++14 -fsyntax-only -I"$prefix/include" "$file" >"$tmp/cxx14.log" 2>&1; then
    fail "$file compiled as C++14"
  fi
  # The first error is the header's (the consumer's code then misses the C++ API).
  grep -m 1 'error:' "$tmp/cxx14.log" | grep -q 'concord/concord.hpp needs C++17' || {
    cat "$tmp/cxx14.log"; fail "$file as C++14: the first error does not name C++17"; }
done
# The header alone: that error only, not a cascade.
c++ -std=c++14 -fsyntax-only -I"$prefix/include" "$tmp/cxx14.cpp" >"$tmp/cxx14.log" 2>&1 || true
errors="$(grep -c 'error:' "$tmp/cxx14.log" || true)"
[[ "$errors" -eq 1 ]] || { head -20 "$tmp/cxx14.log"; fail "concord.hpp as C++14: $errors errors"; }

# pc_consumer PKG_CONFIG_DIR NAME: pkg-config's paths for concord exist (-I holds
# concord/concord.h, -L libconcord.so), and the C consumer built with its flags runs.
pc_consumer() {
  local flags word dir
  flags="$(PKG_CONFIG_PATH="$1" pkg-config --cflags --libs concord)" ||
    fail "$2: pkg-config does not know concord"
  echo "$2: pkg-config --cflags --libs concord: $flags"
  for word in $flags; do
    dir="${word:2}"
    case "$word" in
      -I*) [[ -f "$dir/concord/concord.h" ]] || fail "$2: -I$dir has no concord/concord.h" ;;
      -L*) [[ -e "$dir/libconcord.so" ]] || fail "$2: -L$dir has no libconcord.so" ;;
    esac
  done
  # shellcheck disable=SC2086
  cc -std=c99 -Wall -Wextra -pedantic -Werror -o "$tmp/consumer_$2" \
    "$src/tests/install/consumer/main.c" $flags || fail "$2: building with pkg-config's flags failed"
  env -u CONCORD_RANK -u CONCORD_SIZE -u CONCORD_STORE \
    LD_LIBRARY_PATH="$(PKG_CONFIG_PATH="$1" pkg-config --variable=libdir concord)" \
    timeout 30 "$tmp/consumer_$2"
}

# install_layout NAME CMAKE_ARGS...: configures the source into $tmp/NAME-tree with CMAKE_ARGS
# (the install directories), copies BUILD's library and concordrun in, and installs it into
# $tmp/NAME.
install_layout() {
  local name=$1 tree="$tmp/$1-tree"
  shift
  cmake -S "$src" -B "$tree" -DCONCORD_BUILD_TESTS=OFF -DCONCORD_BUILD_PERF=OFF \
    -DCMAKE_SKIP_RPATH=ON "$@" >"$tmp/$name.log" 2>&1 || {
    cat "$tmp/$name.log"; fail "$name: configuring failed"; }
  cp -P "$build"/libconcord.so* "$tree/"
  cp "$build/tools/concordrun" "$tree/tools/"
  cmake --install "$tree" --prefix "$tmp/$name" >>"$tmp/$name.log" 2>&1 || {
    cat "$tmp/$name.log"; fail "$name: cmake --install failed"; }
}

step "concord.pc with CMAKE_INSTALL_LIBDIR=lib/x86_64-linux-gnu"
install_layout multiarch -DCMAKE_INSTALL_LIBDIR=lib/x86_64-linux-gnu
pc_consumer "$tmp/multiarch/lib/x86_64-linux-gnu/pkgconfig" multiarch
step "the same, moved elsewhere"
mv "$tmp/multiarch" "$tmp/moved"
pc_consumer "$tmp/moved/lib/x86_64-linux-gnu/pkgconfig" moved

step "concord.pc with an absolute libdir (the prefix is the one installed to)"
install_layout abslib -DCMAKE_INSTALL_LIBDIR="$tmp/abslib-lib/x/y"
pc_consumer "$tmp/abslib-lib/x/y/pkgconfig" abslib
[[ "$(PKG_CONFIG_PATH="$tmp/abslib-lib/x/y/pkgconfig" pkg-config --variable=includedir concord)" \
  == "$tmp/abslib/include" ]] || fail "abslib: includedir is not under the prefix installed to"

step "concord.pc with lib64 and an absolute includedir"
install_layout absinclude -DCMAKE_INSTALL_LIBDIR=lib64 \
  -DCMAKE_INSTALL_INCLUDEDIR="$tmp/absinclude-include"
pc_consumer "$tmp/absinclude/lib64/pkgconfig" absinclude

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
