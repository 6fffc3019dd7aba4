#!/usr/bin/env bash
# Makes the test certificates of tests/suite/tls.rs: a CA, and a certificate it signs for the name
# `fleet.test` only (no IP address), so that a client that checks the certificate against an
# address instead of the name fails. Valid for 100 years; run again to replace them.
set -euo pipefail
cd "$(dirname "$0")"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
openssl ecparam -name prime256v1 -genkey -noout -out "$tmp/ca.key"
openssl req -x509 -new -key "$tmp/ca.key" -days 36500 -subj "/CN=tonic-balancer test CA" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
  -out ca.pem
openssl ecparam -name prime256v1 -genkey -noout -out "$tmp/server.key"
openssl pkcs8 -topk8 -nocrypt -in "$tmp/server.key" -out server.key
openssl req -new -key server.key -subj "/CN=fleet.test" -out "$tmp/server.csr"
printf 'subjectAltName=DNS:fleet.test\nbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n' > "$tmp/ext"
openssl x509 -req -in "$tmp/server.csr" -CA ca.pem -CAkey "$tmp/ca.key" -set_serial "0x$(openssl rand -hex 8)" \
  -days 36500 -extfile "$tmp/ext" -out server.pem
