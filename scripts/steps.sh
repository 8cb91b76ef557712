# Step timing, sourced by .ci/run and scripts/test (not run by itself).
#
#   step NAME command args...   runs the command, records its wall-clock seconds and the CPU
#                               seconds (user + system) of the processes it waited for, and
#                               returns the command's status.
#   step_table                  prints the table of every step recorded so far, and the total.
#
# Steps go to the file named by STOKER_STEPS_FILE, so that .ci/run and the scripts it calls
# write one table; the script that created the file (steps_owner) prints it and removes it, from
# an EXIT trap, so a failed run still shows where its time went.
if [ -z "${STOKER_STEPS_FILE:-}" ]; then
  STOKER_STEPS_FILE="$(mktemp)"
  export STOKER_STEPS_FILE
  steps_owner=1
else
  steps_owner=0
fi
__steps_t0=$(date +%s.%N)

# Sets __steps_cpu_s to the children's CPU seconds so far. `times` must run in this shell, not
# in a $(...) subshell (which would report its own children), so it writes to a file first.
__steps_cpu() {
  times >"$STOKER_STEPS_FILE.cpu"
  __steps_cpu_s=$(tail -n 1 "$STOKER_STEPS_FILE.cpu" | awk '{ split($1, u, "m"); split($2, s, "m"); sub("s", "", u[2]); sub("s", "", s[2]); printf "%.1f", u[1] * 60 + u[2] + s[1] * 60 + s[2] }')
}

step() {
  local name="$1" w0 c0 w rc=0
  shift
  echo "== step: $name"
  w0=$(date +%s.%N)
  __steps_cpu
  c0=$__steps_cpu_s
  "$@" || rc=$?
  __steps_cpu
  w=$(awk -v a="$(date +%s.%N)" -v b="$w0" 'BEGIN { printf "%.0f", a - b }')
  printf '%s\t%s\t%s\t%s\n' "$name" "$w" "$(awk -v a="$__steps_cpu_s" -v b="$c0" 'BEGIN { printf "%.0f", a - b }')" "$rc" >>"$STOKER_STEPS_FILE"
  echo "== step: $name: ${w} s$([ "$rc" -eq 0 ] || echo ", FAILED (exit $rc)")"
  return "$rc"
}

step_table() {
  [ "$steps_owner" = 1 ] || return 0
  if [ -s "$STOKER_STEPS_FILE" ]; then
    __steps_print
  fi
  rm -f "$STOKER_STEPS_FILE" "$STOKER_STEPS_FILE".cpu
}

__steps_print() {
  echo
  echo "Steps (wall-clock seconds; CPU = user + system seconds of the step's processes):"
  awk -F'\t' 'BEGIN { printf "| %-46s | %6s | %6s |\n|---|---:|---:|\n", "step", "wall", "CPU" }
    { w += $2; c += $3; printf "| %-46s | %6d | %6d |%s\n", $1, $2, $3, ($4 == 0 ? "" : " failed, exit " $4) }
    END { printf "| %-46s | %6d | %6d |\n", "total", w, c }' "$STOKER_STEPS_FILE"
  echo "elapsed: $(awk -v a="$(date +%s.%N)" -v b="$__steps_t0" 'BEGIN { printf "%.0f", a - b }') s"
}
