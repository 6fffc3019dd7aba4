#!/usr/bin/env bash
# Builds the test peers before a test run, so that the run downloads nothing: the grpc-go
# server (peers/go) into target/peers/peer-go, the xDS control plane (peers/xds) into
# target/peers/peer-xds, and a virtualenv with the grpcio server's and xDS client's packages
# (peers/python/requirements.txt) in target/peers/venv. The test harness
# (fleet-service/src/peers.rs and xds.rs) does the same on first use and finds this work done:
# the same paths, and the venv's copy of requirements.txt says what it has.
#
# A missing Go or Python 3 (or no network on the first run) is reported; with CI=true it fails.
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-target}
case $target in /*) ;; *) target="$PWD/$target" ;; esac
out="$target/peers"
mkdir -p "$out"

missing() {
  echo "build-peers: $1" >&2
  if [ "${CI:-}" = true ]; then exit 1; fi
}

if command -v go >/dev/null; then
  # The toolchain that is here: never download another (go.mod says which it needs).
  (cd peers/go && GOTOOLCHAIN=local go mod download && GOTOOLCHAIN=local go build -o "$out/peer-go" .) \
    || missing "go build of peers/go failed (Go 1.26+ and, on the first run, the Go module proxy)"
  # The xDS control plane (go-control-plane's snapshot cache and ADS server): fleet-service/src/xds.rs.
  (cd peers/xds && GOTOOLCHAIN=local go mod download && GOTOOLCHAIN=local go build -o "$out/peer-xds" .) \
    || missing "go build of peers/xds failed (Go 1.26+ and, on the first run, the Go module proxy)"
else
  missing "Go is missing: install Go 1.26+ (https://go.dev/dl/) for the grpc-go peer"
fi

if command -v python3 >/dev/null; then
  venv="$out/venv"
  if ! cmp -s peers/python/requirements.txt "$venv/requirements.txt" || [ ! -x "$venv/bin/python" ]; then
    rm -rf "$venv"
    if python3 -m venv "$venv" \
      && "$venv/bin/python" -m pip install --disable-pip-version-check -q -r peers/python/requirements.txt; then
      cp peers/python/requirements.txt "$venv/requirements.txt"
    else
      rm -rf "$venv"
      missing "the Python peer's venv failed (python3-venv, and PyPI on the first run)"
    fi
  fi
else
  missing "Python 3 is missing: install python3 and python3-venv for the grpcio peer"
fi
