#!/usr/bin/env bash
# Instructions per unary call on the client, counted by valgrind's callgrind: for each contender,
# (instructions for 2N calls - instructions for N calls) / N, repeated R times.
# Usage: scripts/instructions.sh [N] [IN_FLIGHT] [R]
#        scripts/instructions.sh pick [N]: instructions per pick alone (50 instances of the pick
#        benchmark's fleet, busy and idle, the default and least pending), the same way.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = pick ]; then
  N=${2:-100000}
  cargo build --release --example instructions >/dev/null 2>&1
  BIN=target/release/examples/instructions
  picks() { # fleet strategy picks
    valgrind --tool=callgrind --callgrind-out-file=/dev/null "$BIN" pick "$1" "$2" "$3" 2>&1 \
      | sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
  }
  echo "instructions per pick over 50 instances ($N vs $((2 * N)) picks)"
  for fleet in busy idle; do
    for s in fewest_then_fastest least_pending; do
      a=$(picks $fleet $s "$N"); b=$(picks $fleet $s $((2 * N)))
      echo "$fleet $s: $(( (b - a) / N ))"
    done
  done
  exit 0
fi
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
