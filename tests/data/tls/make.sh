#!/usr/bin/env bash
# Makes the test certificates, valid for 100 years; run again to replace them (`./make.sh fleet`
# or `./make.sh xds` replaces one set only).
#
# fleet (tests/suite/tls.rs): a CA (ca.pem), and a certificate it signs for the name `fleet.test`
# only (no IP address), so that a client that checks the certificate against an address instead
# of the name fails.
#
# xds (tests/suite/xds_tls.rs, the control plane of peers/xds over TLS): a CA of its own
# (xds-ca.pem), a server certificate it signs for `localhost` and 127.0.0.1 (the control plane
# listens on 127.0.0.1 and the bootstrap names that address), and a client certificate it signs
# for mTLS (clientAuth only). The fleet's CA did not sign them: it is the "wrong CA" of the tests.
set -euo pipefail
cd "$(dirname "$0")"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# A self-signed CA: key $tmp/$1.key, certificate $1.pem, common name $2.
ca() {
  openssl ecparam -name prime256v1 -genkey -noout -out "$tmp/$1.key"
  openssl req -x509 -new -key "$tmp/$1.key" -days 36500 -subj "/CN=$2" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -out "$1.pem"
}

# A leaf signed by CA $1: key $2.key (PKCS#8), certificate $2.pem, common name $3, and these
# extensions ($4: subjectAltName and extendedKeyUsage lines).
leaf() {
  openssl ecparam -name prime256v1 -genkey -noout -out "$tmp/$2.ec"
  openssl pkcs8 -topk8 -nocrypt -in "$tmp/$2.ec" -out "$2.key"
  openssl req -new -key "$2.key" -subj "/CN=$3" -out "$tmp/$2.csr"
  printf '%sbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n' "$4" > "$tmp/$2.ext"
  openssl x509 -req -in "$tmp/$2.csr" -CA "$1.pem" -CAkey "$tmp/$1.key" \
    -set_serial "0x$(openssl rand -hex 8)" -days 36500 -extfile "$tmp/$2.ext" -out "$2.pem"
}

sets=${1:-all}
if [[ $sets == all || $sets == fleet ]]; then
  ca ca "tonic-balancer test CA"
  leaf ca server fleet.test $'subjectAltName=DNS:fleet.test\nextendedKeyUsage=serverAuth\n'
fi
if [[ $sets == all || $sets == xds ]]; then
  ca xds-ca "tonic-balancer xDS test CA"
  leaf xds-ca xds-server localhost \
    $'subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n'
  leaf xds-ca xds-client xds-client $'extendedKeyUsage=clientAuth\n'
fi
