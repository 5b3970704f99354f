# Sourced by the GPU check scripts (decode-gpu-check.sh,
# quant-decode-gpu-check.sh): `step NAME SECONDS COMMAND...` runs COMMAND
# under a time limit into $out/NAME.log, says ok or FAILED (and sets
# status=1), then prints the log's lines that match $step_keep (an extended
# regex) and not $step_drop, the last ${TAIL:-20} of them. The caller sets
# out, step_keep and, optionally, step_drop.
status=0
step() {  # name seconds command...
  local name=$1 limit=$2
  shift 2
  echo "=== $name: $*"
  if timeout -k 5 "$limit" "$@" >"$out/$name.log" 2>&1; then
    echo "--- $name: ok"
  else
    echo "--- $name: FAILED ($?)"
    status=1
  fi
  grep -E "$step_keep" "$out/$name.log" | grep -vE "${step_drop:-^$}" | cut -c1-200 |
    tail -n "${TAIL:-20}"
}
