#!/usr/bin/env bash
# The format check (the first step of scripts/test.sh): clang-format in dry-run mode, with the
# repository's .clang-format, over every C, C++ and CUDA file git tracks. Prints the files whose
# formatting differs and the command that fixes them; exits 1 if there is any. The style is
# clang-format 14's (Debian 12's, installed by scripts/setup.sh): another version may format a few
# constructs differently. CLANG_FORMAT names another binary.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
format="${CLANG_FORMAT:-clang-format}"
mapfile -d '' files < <(git ls-files -z -- '*.cc' '*.h' '*.hpp' '*.c' '*.cu' '*.cuh')
bad=()
for f in "${files[@]}"; do
  [ -f "$f" ] || continue  # deleted in the working tree, not yet in git
  "$format" --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if [ ${#bad[@]} -gt 0 ]; then
  echo "format-check: ${#bad[@]} of ${#files[@]} files are not formatted as .clang-format says" \
       "($("$format" --version)):"
  printf '  %s\n' "${bad[@]}"
  echo "fix with: $format -i ${bad[*]}"
  exit 1
fi
echo "format-check: ${#files[@]} files formatted"
