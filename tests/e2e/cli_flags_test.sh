#!/usr/bin/env bash
# The kplan binary's flag vocabulary end to end, offline: --version, vLLM's
# spellings giving the same request as the canonical ones, a --help that lists
# every flag with its default, and errors that name the flag with exit 2.
set -euo pipefail
bin=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
kplan=$bin/kplan

"$kplan" --version | grep -Eq '^kplan [0-9]+\.[0-9]+\.[0-9]+ \(' || { "$kplan" --version; exit 1; }

# One request, four spellings: each must resolve to the same JSON.
moe=(--num-experts 8 --hidden-size 1024 --intermediate-size 2048 --renormalize)
"$kplan" resolve --offline --json --platform cuda:9.0 --moe-backend triton \
  --tensor-parallel-size 2 --top-k 2 --routing-method Renormalize "${moe[@]}" >"$work/canonical.json"
grep -q '"tp_size": 2' "$work/canonical.json"
grep -q '"moe_backend": "triton"' "$work/canonical.json"
"$kplan" resolve --offline --json --platform cuda:9.0 --moe_backend triton -tp 2 \
  --experts-per-token 2 --routing Renormalize "${moe[@]}" >"$work/old.json"
diff -u "$work/canonical.json" "$work/old.json"
"$kplan" resolve --offline --json --platform=cuda:9.0 --moe_backend=triton -tp=2 --top_k=2 \
  --routing_method=Renormalize --num_experts=8 --hidden_size=1024 --intermediate_size=2048 \
  --renormalize >"$work/underscores.json"
diff -u "$work/canonical.json" "$work/underscores.json"

# --help: every flag with its default, for each command.
"$kplan" run-moe --help >"$work/help.txt"
for flag in --server --timeout --tls-ca --tls-cert --tls-key --token-file --json --id --tokens \
  --top-k --experts-per-token --routing-method --moe-backend --all2all-backend --repeat --dtype \
  --seed; do
  grep -q -- "$flag" "$work/help.txt" || { echo "run-moe --help lacks $flag"; cat "$work/help.txt"; exit 1; }
done
grep -q -- "--top-k,--experts-per-token K .*(default: 2)" "$work/help.txt"
"$kplan" load --help >"$work/load-help.txt"
grep -q -- "--hidden-size,--hidden H" "$work/load-help.txt"
# A load's deadline grows with its size: its --help must not claim the 10 s of other calls.
grep -q -- "--timeout SECONDS .*(default: 60 plus 1 per 100 MB of weights)$" "$work/load-help.txt" ||
  { grep -- --timeout "$work/load-help.txt"; exit 1; }
grep -q -- "--timeout SECONDS .*(default: 10)$" "$work/help.txt"
"$kplan" resolve --help | grep -q -- "--tensor-parallel-size N .*(also -tp)"
"$kplan" unload --help | grep -q -- "--id ID"

# Errors name the flag and exit 2.
set +e
"$kplan" resolve --offline --moe_bakend triton 2>"$work/err.txt"
rc=$?
set -e
[ "$rc" = 2 ] || { echo "unknown flag: expected exit 2, got $rc"; exit 1; }
grep -q -- "--moe-bakend" "$work/err.txt" && grep -q "\[field: moe-bakend\]" "$work/err.txt"
set +e
"$kplan" resolve --offline -tp=two 2>"$work/err.txt"
rc=$?
set -e
[ "$rc" = 2 ] || { echo "-tp=two: expected exit 2, got $rc"; exit 1; }
grep -q -- "--tensor-parallel-size needs an integer, got 'two'" "$work/err.txt"
echo "cli_flags_test: ok"
