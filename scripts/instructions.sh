#!/usr/bin/env bash
# Instructions per unary call on the client, counted by valgrind's callgrind: for each contender,
# (instructions for 2N calls - instructions for N calls) / N, repeated R times.
# Usage: scripts/instructions.sh [N] [IN_FLIGHT] [R]
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-2000}
IN_FLIGHT=${2:-32}
R=${3:-2}
cargo build --release --example instructions >/dev/null 2>&1
BIN=target/release/examples/instructions
P1=$((40000 + RANDOM % 10000)); P2=$((P1 + 1))
$BIN serve $P1 & S1=$!
$BIN serve $P2 & S2=$!
trap 'kill $S1 $S2 2>/dev/null' EXIT
sleep 0.5
count() { # kind uris calls
  valgrind --tool=callgrind --callgrind-out-file=/dev/null "$BIN" call "$1" "$2" "$3" "$IN_FLIGHT" 2>&1 \
    | sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}
U1="http://127.0.0.1:$P1"
U2="$U1,http://127.0.0.1:$P2"
echo "client instructions per call ($N vs $((2 * N)) calls, $IN_FLIGHT in flight, $R runs each)"
for kind in direct balanced balanced_n balance_list; do
  uris=$U1; [ "$kind" = balanced_n ] && uris=$U2
  for r in $(seq "$R"); do
    a=$(count "$kind" "$uris" "$N"); b=$(count "$kind" "$uris" $((2 * N)))
    echo "$kind run $r: $(( (b - a) / N ))"
  done
done
