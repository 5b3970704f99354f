#!/usr/bin/env bash
# Generates a throwaway test PKI in $1: a CA, a server certificate for
# localhost/127.0.0.1, a client certificate, a peer certificate (server and
# client use, for servers that call each other), and a second ("rogue") CA
# with a client certificate of its own. Keys are EC P-256, valid for one day.
set -euo pipefail
out=$1
mkdir -p "$out"
cd "$out"
cert() {  # name ca subject [extensions]
  local name=$1 ca=$2 subject=$3 ext=${4:-}
  openssl ecparam -name prime256v1 -genkey -noout -out "$name.key" 2>/dev/null
  openssl req -new -key "$name.key" -subj "$subject" -out "$name.csr" 2>/dev/null
  if [ -n "$ext" ]; then printf '%s\n' "$ext" >"$name.ext"; else : >"$name.ext"; fi
  openssl x509 -req -in "$name.csr" -CA "$ca.pem" -CAkey "$ca.key" -CAcreateserial -days 1 \
    -extfile "$name.ext" -out "$name.pem" 2>/dev/null
}
for ca in ca rogue_ca; do
  openssl ecparam -name prime256v1 -genkey -noout -out "$ca.key" 2>/dev/null
  openssl req -x509 -new -key "$ca.key" -subj "/CN=kplan test $ca" -days 1 -out "$ca.pem" 2>/dev/null
done
cert server ca "/CN=localhost" "subjectAltName=DNS:localhost,IP:127.0.0.1
extendedKeyUsage=serverAuth"
cert client ca "/CN=kplan test client" "extendedKeyUsage=clientAuth"
# A server that also calls other servers (the ranks of an expert-parallel group).
cert peer ca "/CN=localhost" "subjectAltName=DNS:localhost,IP:127.0.0.1
extendedKeyUsage=serverAuth,clientAuth"
cert rogue_client rogue_ca "/CN=rogue client" "extendedKeyUsage=clientAuth"
echo "test-token-$(date +%s%N)" >token
echo "certificates in $out"
