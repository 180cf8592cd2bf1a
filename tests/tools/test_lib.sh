# Shared by tests/tools' scripts (sourced): failures counted by fail(), and wait_for().

failures=0

# fail MESSAGE...: reports a failed check; the script ends with status 1 if any failed.
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

# wait_for SECONDS COMMAND...: runs COMMAND every 0.05 s until it succeeds (0) or SECONDS pass (1).
wait_for() {
  local tries=$(($1 * 20))
  shift
  for ((i = 0; i < tries; i++)); do
    "$@" && return 0
    sleep 0.05
  done
  return 1
}
