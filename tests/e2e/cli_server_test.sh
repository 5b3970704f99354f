#!/usr/bin/env bash
# End to end: the kplan-server binary and the kplan CLI. Starts a server on a
# free loopback port, checks health, compares server and --offline answers,
# checks an error's exit code and text, drives the MoE commands (also on a
# second server with a CPU expert-parallel group), then SIGTERM must drain and
# exit 0.
set -euo pipefail
bin=$1
work=$(mktemp -d)
server_pid=""
ep_pid=""
shm_pid=""
cleanup() {
  [ -n "$server_pid" ] && kill -9 "$server_pid" 2>/dev/null
  [ -n "$shm_pid" ] && kill -9 "$shm_pid" 2>/dev/null
  [ -n "$ep_pid" ] && kill -9 "$ep_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

source "$(dirname "$0")/../../scripts/server-port.sh"
# Waits for the server logging to $1 (pid $2) to listen; prints its address.
server_addr() {
  local port
  port=$(kplan_server_port "$1" "$2") || return 1
  echo "127.0.0.1:$port"
}

mkdir "$work/models"
"$bin/kplan-server" --listen=127.0.0.1:0 --exit_timeout=5s --model_root="$work/models" \
  >"$work/server.log" 2>&1 &
server_pid=$!
addr=$(server_addr "$work/server.log" "$server_pid")

[ "$("$bin/kplan" health --server "$addr")" = "SERVING" ]
[ "$("$bin/kplan" health --server "$addr" --service kplan.v1.KernelPlanService)" = "SERVING" ]
"$bin/kplan" health --server "$addr" --json --service kplan.v1.KernelPlanService |
  /usr/bin/python3 -c 'import json, sys; d = json.load(sys.stdin); assert d == {"service": "kplan.v1.KernelPlanService", "status": "SERVING"} and list(d) == ["service", "status"], d'

args=(--platform cuda:10.0 --moe-backend FlashInfer-MoE-EP-CuteDSL --ir-op-priority "rms_norm=native, vllm_c"
      --env VLLM_USE_OINK_OPS=1 --architectures DeepseekV4ForCausalLM -tp 2)
"$bin/kplan" resolve --server "$addr" --json "${args[@]}" >"$work/online.json"
"$bin/kplan" resolve --offline --json "${args[@]}" >"$work/offline.json"
diff -u "$work/online.json" "$work/offline.json"
grep -q '"all2all_backend": "passthrough"' "$work/online.json"
grep -q '"config_hash": "[0-9a-f]\{64\}"' "$work/online.json"

# A bad request: exit code 2, vLLM's text, the field named; the server keeps serving.
set +e
"$bin/kplan" resolve --server "$addr" --moe-backend triton --all2all-backend passthrough 2>"$work/err.txt"
rc=$?
set -e
[ "$rc" = 2 ] || { echo "expected exit 2, got $rc"; exit 1; }
grep -q "INVALID_ARGUMENT: all2all_backend='passthrough' is only valid with a moe_backend" "$work/err.txt"
grep -q "\[field: parallel.all2all_backend\]" "$work/err.txt"
"$bin/kplan" info --server "$addr" | grep -q "version:"

# explain: the candidate table of a DeepSeek-V3 fp8 layer on an SM100 platform.
"$bin/kplan" explain --server "$addr" --platform cuda:10.0 --num-experts 256 --experts-per-token 8 \
  --hidden-size 7168 --intermediate-size 2048 --weight-quant kFp8Static128BlockSym \
  --activation-quant kFp8Dynamic128Sym --scoring-func sigmoid --renormalize --num-expert-group 8 \
  --topk-group 4 --e-score-correction-bias >"$work/explain.txt"
grep -q "chosen: FLASHINFER_TRTLLM" "$work/explain.txt" || { cat "$work/explain.txt"; exit 1; }
grep -q "accepted" "$work/explain.txt"
# --json: one document of what the table shows, in resolve --json's names.
"$bin/kplan" explain --server "$addr" --platform cuda:10.0 --num-experts 256 --experts-per-token 8 \
  --hidden-size 7168 --intermediate-size 2048 --weight-quant kFp8Static128BlockSym \
  --activation-quant kFp8Dynamic128Sym --scoring-func sigmoid --renormalize --num-expert-group 8 \
  --topk-group 4 --e-score-correction-bias --json |
  /usr/bin/python3 -c 'import json, sys; d = json.load(sys.stdin); assert sorted(d) == ["moe_plans", "warnings"], d; p = d["moe_plans"][0]; assert p["backend"] == "FLASHINFER_TRTLLM", p; assert any(c["accepted"] for c in p["candidates"]), p'
# No MoE layer: the same refusal with --json as without.
rc=0
"$bin/kplan" explain --offline --json >/dev/null 2>"$work/err.txt" || rc=$?
[ "$rc" = 2 ] || { echo "explain --json without a layer: expected exit 2, got $rc"; exit 1; }
grep -q "no MoE layer to explain" "$work/err.txt"
"$bin/kplan" resolve --offline --platform cuda:9.0 --compare-platform cuda:10.0 --num-experts 8 \
  --experts-per-token 2 --hidden-size 4096 --intermediate-size 14336 --renormalize >"$work/compare.txt"
# --json: one document with both answers.
"$bin/kplan" resolve --offline --platform cuda:9.0 --compare-platform cuda:10.0 --num-experts 8 \
  --experts-per-token 2 --hidden-size 4096 --intermediate-size 14336 --json |
  /usr/bin/python3 -c 'import json, sys; d = json.load(sys.stdin); assert sorted(d) == ["compare_platform", "platform"], d; assert d["compare_platform"]["platform"]["device_capability"]["major"] == 10, d'
grep -q "FLASHINFER_TRTLLM" "$work/compare.txt" && grep -q "TRITON" "$work/compare.txt"

# The README's Python example against this server.
if /usr/bin/python3 -c "import grpc, numpy" 2>/dev/null; then
  PYTHONPATH="$(dirname "$0")/../../client/python" \
    /usr/bin/python3 "$(dirname "$0")/../../client/python/example.py" "$addr" >"$work/example.txt"
  grep -q "all2all_backend: passthrough" "$work/example.txt"
  grep -q "output: (4, 64) backend: emulation" "$work/example.txt"
fi

# The MoE commands on the CPU path: load random experts, list them, run a layer, unload.
"$bin/kplan" load --server "$addr" --id cli-layer --random --num-experts 8 --hidden 64 \
  --intermediate 128 >"$work/load.txt"
grep -q "^cli-layer .* bfloat16 .* silu" "$work/load.txt" || { cat "$work/load.txt"; exit 1; }
# Progress as the server counts it, on stderr (not a terminal here: a line
# per tenth reached when polled, then 100%), while a second client sees the
# load mid-way in ListExperts; then READY. A load whose client goes away
# leaves the list.
loading_state() {  # loading_state ID: "loading" when 0 < bytes_done < bytes_total, else the state
  "$bin/kplan" experts --server "$addr" --json | /usr/bin/python3 -c '
import json, sys
sets = [e for e in json.load(sys.stdin)["experts"] if e["experts_id"] == sys.argv[1]]
p = sets[0].get("progress", {}) if sets else {}
mid = 0 < int(p.get("bytes_done", 0)) < int(p.get("bytes_total", 0))
print("loading" if sets and mid else sets[0]["state"] if sets else "absent")' "$1"
}
wait_state() {  # wait_state ID STATE
  for _ in $(seq 400); do
    [ "$(loading_state "$1")" = "$2" ] && return 0
    sleep 0.05
  done
  echo "$1 never became $2"
  return 1
}
"$bin/kplan" load --server "$addr" --id cli-progress --random --num-experts 8 --hidden-size 1024 \
  --intermediate-size 1024 >/dev/null 2>"$work/progress.txt" &
load_pid=$!
wait_state cli-progress loading
"$bin/kplan" experts --server "$addr" | grep -q "^cli-progress  *\(loading [0-9]*%\|ready\) " ||
  { "$bin/kplan" experts --server "$addr"; exit 1; }
wait "$load_pid"
[ "$(loading_state cli-progress)" = ready ]
[ "$(grep -c '^loading: [0-9]*% (' "$work/progress.txt")" -ge 2 ] &&
  grep -q "^loading: 100% (48.0 MiB of 48.0 MiB, 8 of 8 experts)" "$work/progress.txt" ||
  { echo "expected progress lines up to 100%"; cat "$work/progress.txt"; exit 1; }
"$bin/kplan" unload --server "$addr" --id cli-progress >/dev/null
"$bin/kplan" load --server "$addr" --id cli-gone --random --num-experts 8 --hidden-size 1024 \
  --intermediate-size 1024 >/dev/null 2>&1 &
load_pid=$!
wait_state cli-gone loading
kill -TERM "$load_pid"
wait "$load_pid" || true
wait_state cli-gone absent
"$bin/kplan" experts --server "$addr" >"$work/experts.txt"
grep -q "^cli-layer  *ready  *8  *64  *128 " "$work/experts.txt" || { cat "$work/experts.txt"; exit 1; }
"$bin/kplan" experts --server "$addr" --json >"$work/experts.json"
grep -q '"experts_id": "cli-layer"' "$work/experts.json"
grep -q '"dtype": "bfloat16"' "$work/experts.json" || { cat "$work/experts.json"; exit 1; }
"$bin/kplan" run-moe --server "$addr" --id cli-layer --tokens 16 --top-k 2 --repeat 3 \
  >"$work/run.txt"
grep -q "^backend: *emulation" "$work/run.txt" || { cat "$work/run.txt"; exit 1; }
grep -q "median of 3 runs" "$work/run.txt"
grep -q "^candidates (in the order tried):" "$work/run.txt" || { cat "$work/run.txt"; exit 1; }
grep -q "^coalesced: *no (coalescing off" "$work/run.txt" || { cat "$work/run.txt"; exit 1; }
"$bin/kplan" run-moe --server "$addr" --id cli-layer --tokens 4 --json >"$work/run.json"
grep -q '"backend": "emulation"' "$work/run.json" || { cat "$work/run.json"; exit 1; }
grep -q '"coalesced_requests": 0' "$work/run.json" || { cat "$work/run.json"; exit 1; }
"$bin/kplan" run-moe --server "$addr" --id=cli-layer --tokens=4 --experts-per-token 1 \
  --moe_backend emulation --routing Default | grep -q "^backend: *emulation"
set +e
"$bin/kplan" run-moe --server "$addr" --id cli-layer --tokens many 2>"$work/err.txt"
rc=$?
set -e
[ "$rc" = 2 ] || { echo "run-moe --tokens many: expected exit 2, got $rc"; exit 1; }
grep -q -- "--tokens needs an integer" "$work/err.txt"

# run-moe --shm: the tensors through a POSIX region of the CLI's (created,
# registered, read back, removed), the output equal to the inline run's; on a
# server without --allow_shared_memory a clear refusal, and nothing left in
# /dev/shm either way.
"$bin/kplan-server" --listen="unix:$work/shm.sock" --devices=none --allow_shared_memory \
  --exit_timeout=5s >"$work/shm_server.log" 2>&1 &
shm_pid=$!
for _ in $(seq 100); do [ -S "$work/shm.sock" ] && break; sleep 0.1; done
shm_addr="unix:$work/shm.sock"
"$bin/kplan" load --server "$shm_addr" --id shm-layer --random --num-experts 8 --hidden 64 \
  --intermediate 128 >/dev/null
"$bin/kplan" run-moe --server "$shm_addr" --id shm-layer --tokens 7 --seed 5 --repeat 2 \
  --output-file "$work/inline.out" >/dev/null
"$bin/kplan" run-moe --server "$shm_addr" --id shm-layer --tokens 7 --seed 5 --repeat 2 --shm \
  --output-file "$work/shm.out" >"$work/run_shm.txt"
grep -q "^backend: *emulation" "$work/run_shm.txt" || { cat "$work/run_shm.txt"; exit 1; }
[ "$(stat -c %s "$work/shm.out")" = $((7 * 64 * 2)) ] || { echo "--shm output size"; exit 1; }
cmp "$work/inline.out" "$work/shm.out" || { echo "--shm output differs from inline"; exit 1; }
[ "$("$bin/kplan" experts --server "$shm_addr" --json | grep -c shm-layer)" -ge 1 ]
set +e
"$bin/kplan" run-moe --server "$addr" --id cli-layer --tokens 2 --shm 2>"$work/err.txt"
rc=$?
set -e
[ "$rc" != 0 ] || { echo "run-moe --shm without --allow_shared_memory succeeded"; exit 1; }
grep -q "FAILED_PRECONDITION: shared-memory regions are off" "$work/err.txt" ||
  { cat "$work/err.txt"; exit 1; }
# Regions are kplan-cli-PID-N: one whose CLI has exited was left behind (a
# live PID is another test's run in progress, /dev/shm being shared).
for region in $(ls /dev/shm | grep "^kplan-cli-" || true); do
  pid=${region#kplan-cli-}
  pid=${pid%%-*}
  if ! kill -0 "$pid" 2>/dev/null; then echo "--shm left a region: $region"; exit 1; fi
done
kill -TERM "$shm_pid"
wait "$shm_pid"
shm_pid=""
"$bin/kplan" unload --server "$addr" cli-layer | grep -q "unloaded cli-layer"
"$bin/kplan" experts --server "$addr" >"$work/experts.txt"
if grep -q cli-layer "$work/experts.txt"; then echo "cli-layer still listed"; exit 1; fi

# Raw row-major files on the client host stream chunk by chunk; a file of the wrong size
# is refused before anything is sent, naming its flag.
/usr/bin/python3 - "$work/w13.raw" "$work/w2.raw" <<'PY'
import struct, sys
e, h, i = 2, 16, 16
for path, n in ((sys.argv[1], e * 2 * i * h), (sys.argv[2], e * h * i)):
    with open(path, "wb") as f:
        f.write(b"".join(struct.pack("<f", ((k % 11) - 5) / 64.0) for k in range(n)))
PY
raw_args=(--num-experts 2 --hidden 16 --intermediate 16 --dtype float32)
"$bin/kplan" load --server "$addr" --id cli-raw "${raw_args[@]}" --w13-file "$work/w13.raw" \
  --w2-file "$work/w2.raw" >"$work/load_raw.txt" || { cat "$work/load_raw.txt"; exit 1; }
grep -q "^cli-raw .* float32" "$work/load_raw.txt" || { cat "$work/load_raw.txt"; exit 1; }
"$bin/kplan" run-moe --server "$addr" --id cli-raw --tokens 3 --top-k 2 >"$work/run_raw.txt"
"$bin/kplan" unload --server "$addr" cli-raw | grep -q "unloaded cli-raw"
set +e
"$bin/kplan" load --server "$addr" --id cli-raw "${raw_args[@]}" --w13-file "$work/w2.raw" \
  --w2-file "$work/w2.raw" 2>"$work/err.txt"
rc=$?
set -e
[ "$rc" != 0 ] || { echo "load --w13-file of the wrong size: expected a failure"; exit 1; }
grep -q "\[field: w13-file\]" "$work/err.txt" || { cat "$work/err.txt"; exit 1; }

# A stacked float32 safetensors file under --model_root loads by its relative path; a path
# outside the root is refused with the one text that does not say whether it exists.
/usr/bin/python3 - "$work/models/stacked.safetensors" <<'PY'
import json, struct, sys
e, h, i = 2, 16, 16
w13, w2 = e * 2 * i * h * 4, e * h * i * 4
header = json.dumps({"w13": {"dtype": "F32", "shape": [e, 2 * i, h], "data_offsets": [0, w13]},
                     "w2": {"dtype": "F32", "shape": [e, h, i], "data_offsets": [w13, w13 + w2]}})
data = b"".join(struct.pack("<f", ((k % 13) - 6) / 64.0) for k in range((w13 + w2) // 4))
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<Q", len(header)) + header.encode() + data)
PY
st_args=(--num-experts 2 --hidden 16 --intermediate 16 --dtype float32 --w13 w13 --w2 w2)
"$bin/kplan" load --server "$addr" --id cli-st --safetensors stacked.safetensors "${st_args[@]}" \
  >"$work/load_st.txt" 2>"$work/load_st_err.txt" || { cat "$work/load_st.txt"; exit 1; }
grep -q "^loading: 100% (6.0 KiB of 6.0 KiB, 2 of 2 experts)" "$work/load_st_err.txt" ||
  { cat "$work/load_st_err.txt"; exit 1; }  # a file the server read: its progress too
grep -q "^cli-st .* float32" "$work/load_st.txt" || { cat "$work/load_st.txt"; exit 1; }
"$bin/kplan" unload --server "$addr" --id cli-st | grep -q "unloaded cli-st"
for p in /etc/passwd "$work/models/missing.safetensors" ../server.log; do
  set +e
  "$bin/kplan" load --server "$addr" --id cli-st --safetensors "$p" "${st_args[@]}" 2>"$work/err.txt"
  rc=$?
  set -e
  [ "$rc" != 0 ] || { echo "load --safetensors $p: expected a failure"; exit 1; }
  grep -q "PERMISSION_DENIED: not a readable regular file under the model roots" "$work/err.txt" ||
    { cat "$work/err.txt"; exit 1; }
  grep -q "\[field: header.safetensors.path\]" "$work/err.txt" || { cat "$work/err.txt"; exit 1; }
done

# An expert-parallel group of two CPU ranks: the set is sharded, kplan_all2allv runs.
"$bin/kplan-server" --listen=127.0.0.1:0 --cpu_ep_ranks=2 --exit_timeout=5s >"$work/ep.log" 2>&1 &
ep_pid=$!
ep_addr=$(server_addr "$work/ep.log" "$ep_pid")
"$bin/kplan" load --server "$ep_addr" --id ep-layer --random --num-experts 6 --hidden-size 32 \
  --intermediate_size 64 >/dev/null
"$bin/kplan" experts --server "$ep_addr" >"$work/ep_experts.txt"
grep -q "^ep-layer shards (expert parallel, 2 ranks):$" "$work/ep_experts.txt" || { cat "$work/ep_experts.txt"; exit 1; }
grep -q "^  1  *cpu  *3  *3 " "$work/ep_experts.txt" || { cat "$work/ep_experts.txt"; exit 1; }
"$bin/kplan" run-moe --server "$ep_addr" --id ep-layer --tokens 5 --all2all-backend kplan_all2allv \
  >"$work/ep_run.txt"
grep -q "^all2all backend: *kplan_all2allv" "$work/ep_run.txt" || { cat "$work/ep_run.txt"; exit 1; }
grep -q "^ep size: *2" "$work/ep_run.txt"
# No --model_root here: server-side loads are off.
set +e
"$bin/kplan" load --server "$ep_addr" --id ep-st --safetensors "$work/models/stacked.safetensors" \
  "${st_args[@]}" 2>"$work/err.txt"
rc=$?
set -e
[ "$rc" != 0 ] || { echo "load without --model_root: expected a failure"; exit 1; }
grep -q "server-side loads are off: start the server with --model_root" "$work/err.txt" ||
  { cat "$work/err.txt"; exit 1; }
kill -TERM "$ep_pid"
wait "$ep_pid"
ep_pid=""

kill -TERM "$server_pid"
wait "$server_pid"
rc=$?
server_pid=""
[ "$rc" = 0 ] || { echo "server exited $rc"; cat "$work/server.log"; exit 1; }
grep -q "received SIGTERM" "$work/server.log"
grep -q "server stopped" "$work/server.log"
echo "cli_server_test: ok"
