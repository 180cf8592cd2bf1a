# Shared by tests/tools' scripts (sourced): failures counted by fail(), wait_for(), and the
# background launcher stop_launcher() ends.

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

# The `timeout concordrun ...` a script started in the background ("" when none runs): the
# script's EXIT trap calls stop_launcher, which SIGTERMs it (timeout SIGKILLs what is left) and
# waits for it.
launcher=
stop_launcher() {
  if [ -n "$launcher" ]; then
    kill -TERM "$launcher" 2>/dev/null
    wait "$launcher"
  fi
}
