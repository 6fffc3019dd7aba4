#!/usr/bin/env bash
# What a crate that depends on tonic-balancer compiles, against a crate that uses tonic's own
# Channel (tonic with `channel` and `codegen` only), in fresh consumer crates that each make one
# call. Every consumer sends the same raw gRPC request through its channel, so the difference
# is the channel's own cost.
#
#   scripts/consumer.sh           crates compiled by each consumer (cargo tree), and a check
#   scripts/consumer.sh --time    the same, plus clean debug build times, interleaved (slow)
#
# The check (run by CI) fails if a protobuf compiler or tonic's or hyper's server side is in
# what a consumer of the library compiles.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=${CONSUMER_DIR:-$(mktemp -d)}
time_builds=${1:-}

consumer() { # name, dependency line
  mkdir -p "$work/$1/src"
  cat > "$work/$1/Cargo.toml" <<EOF
[package]
name = "$1"
version = "0.0.0"
edition = "2021"
publish = false

[workspace]

[dependencies]
http = "1"
tokio = { version = "1", features = ["rt-multi-thread", "macros"] }
tower = { version = "0.5", default-features = false }
$2
EOF
  # Share the library's lock file so that both sides build the same versions.
  cp "$root/Cargo.lock" "$work/$1/Cargo.lock"
  # The library is a path dependency here, which cargo would build incrementally (about 2 s more
  # of a clean build on this machine); a user gets it from the registry, built like tonic:
  # without incremental state. The override makes the measured build the user's.
  if [[ $1 == balancer-* ]]; then
    printf '\n[profile.dev.package.tonic-balancer]\nincremental = false\n' >> "$work/$1/Cargo.toml"
  fi
}

consumer tonic-channel 'tonic = { version = "0.14", default-features = false, features = ["channel", "codegen"] }'
consumer balancer-default "tonic-balancer = { path = \"$root\" }
tonic = { version = \"0.14\", default-features = false }"
consumer balancer-minimal "tonic-balancer = { path = \"$root\", default-features = false }
tonic = { version = \"0.14\", default-features = false }"
consumer balancer-hickory "tonic-balancer = { path = \"$root\", features = [\"hickory-dns\"] }
tonic = { version = \"0.14\", default-features = false }"
consumer balancer-health "tonic-balancer = { path = \"$root\", features = [\"health-check\"] }
tonic = { version = \"0.14\", default-features = false }"
consumer balancer-all "tonic-balancer = { path = \"$root\", features = [\"hickory-dns\", \"health-check\"] }
tonic = { version = \"0.14\", default-features = false }"

call='    let req = http::Request::builder()
        .method("POST")
        .uri("http://127.0.0.1:1/pkg.Service/Method")
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(tonic::body::Body::empty())
        .unwrap();
    let result = tower::ServiceExt::oneshot(channel, req).await;
    println!("{:?}", result.map(|r| r.status()));'
cat > "$work/tonic-channel/src/main.rs" <<EOF
#[tokio::main]
async fn main() {
    let channel = tonic::transport::Endpoint::from_static("http://127.0.0.1:1").connect_lazy();
$call
}
EOF
for c in balancer-default balancer-minimal balancer-hickory balancer-health balancer-all; do
  cat > "$work/$c/src/main.rs" <<EOF
#[tokio::main]
async fn main() {
    let channel = tonic_balancer::BalancedChannel::from_static(["http://127.0.0.1:1"]).unwrap();
$call
}
EOF
done

crates() { # the packages a consumer compiles (normal and build dependencies), itself excluded
  (cd "$work/$1" && cargo tree -q -e normal,build --prefix none --format '{p}' \
    | sed 's/ (.*//' | sort -u | grep -v "^$1 " | wc -l)
}

status=0
base=$(crates tonic-channel)
printf '%-18s %7s %8s\n' consumer crates ratio
printf '%-18s %7d %8s\n' tonic-channel "$base" 1.00
for c in balancer-default balancer-minimal balancer-hickory balancer-health balancer-all; do
  n=$(crates "$c")
  printf '%-18s %7d %8.2f\n' "$c" "$n" "$(echo "$n / $base" | bc -l)"
  tree=$(cd "$work/$c" && cargo tree -q -e normal,build,features --prefix none)
  for bad in 'protox ' 'prost-reflect ' 'tonic-prost-build ' 'axum ' 'tonic feature "server"' \
             'tonic feature "router"' 'hyper feature "server"' 'hyper-util feature "server'; do
    if grep -q "^$bad" <<<"$tree"; then
      echo "FAIL: $c compiles ${bad% }, which the library must not bring" >&2
      status=1
    fi
  done
done

# A consumer of the test fleet (its tests' dev-dependency) compiles no protobuf compiler
# either: it brings its service as tonic generated it.
consumer fleet-user "tonic-balancer-fleet = { path = \"$root/fleet\", features = [\"orca\", \"tls\"] }
tonic = { version = \"0.14\", default-features = false }"
cat > "$work/fleet-user/src/main.rs" <<EOF
fn main() {
    let faults = tonic_balancer_fleet::Faults::new();
    faults.set(tonic_balancer_fleet::Script::new().hang());
    println!("{}", faults.calls());
}
EOF
n=$(crates fleet-user)
printf '%-18s %7d %8.2f\n' fleet-user "$n" "$(echo "$n / $base" | bc -l)"
tree=$(cd "$work/fleet-user" && cargo tree -q -e normal,build,features --prefix none)
for bad in 'protox ' 'prost-reflect ' 'prost-build ' 'tonic-prost-build ' 'tonic-build '; do
  if grep -q "^$bad" <<<"$tree"; then
    echo "FAIL: fleet-user compiles ${bad% }, which the fleet must not bring" >&2
    status=1
  fi
done

if [ "$time_builds" = "--time" ]; then
  # Clean debug builds (the crates from scratch; downloads fetched first), interleaved so that
  # the machine's load falls on both sides alike; three rounds, and the median of each.
  # (No default features: the default consumer is also the minimal one.)
  sides="tonic-channel balancer-default"
  for c in $sides; do (cd "$work/$c" && cargo fetch -q); rm -f "$work/times-$c"; done
  for round in 1 2 3; do
    for c in $sides; do
      rm -rf "$work/target-$c"
      start=$(date +%s.%N)
      (cd "$work/$c" && CARGO_TARGET_DIR="$work/target-$c" cargo build -q)
      end=$(date +%s.%N)
      t=$(echo "$end - $start" | bc -l)
      echo "$t" >> "$work/times-$c"
      printf 'round %d %-18s clean build %6.1f s\n' "$round" "$c" "$t"
    done
  done
  median() { sort -n "$work/times-$1" | sed -n 2p; }
  a=$(median tonic-channel); b=$(median balancer-default)
  printf 'median: tonic-channel %.1f s, balancer-default %.1f s, ratio %.2f\n' "$a" "$b" "$(echo "$b / $a" | bc -l)"
fi
exit $status
