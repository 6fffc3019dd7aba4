#!/usr/bin/env bash
# Checks the shootout's live view (`--live`) as a person would see it: in a real terminal
# (tmux), captured every 0.2 s while the kill-and-hang script runs, then stopped with Ctrl-C,
# then piped.
#
#   scripts/live_check.sh            builds the example (release), runs the checks
#   scripts/live_check.sh --debug    the same with the debug build that `cargo test --all-features`
#                                    makes (CI: no second build)
#
# What it checks:
#   1. a whole run in a 100x40 terminal: every instance's row shows; the bars move; the killed
#      instance (i1) goes from ready to failing or connecting, gets 0.0% of the calls, and is
#      ready again after its restart; the hung instance (i2) gets under 5% of the calls once it
#      hangs; at the end the terminal is back (normal screen, cursor shown), the last picture
#      stays, and the exit status is 0;
#   2. Ctrl-C in the middle of a run: exit status 130, the terminal back, a message says why;
#   3. piped output: plain lines (no escape sequence), the events and every instance's line.
# Nothing depends on timing beyond the run's own schedule: every wait polls for what it waits
# for, with bounds far above what a loaded 2-core machine needs. Needs tmux.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
command -v tmux >/dev/null || { echo "live_check: needs tmux" >&2; exit 2; }
profile=release
if [ "${1:-}" = "--debug" ]; then profile=debug; fi
if [ "$profile" = release ]; then
  nice -n 19 cargo build --release --example shootout
else
  cargo build --all-features --example shootout
fi
# Where cargo built it (CARGO_TARGET_DIR, a config's build.target-dir, else target/).
target_dir=$(cargo metadata --format-version 1 --no-deps \
  | python3 -c 'import sys,json;print(json.load(sys.stdin)["target_directory"])')
bin="$target_dir/$profile/examples/shootout"
work=$(mktemp -d)
session="live-check-$$"
failed=0
cleanup() {
  tmux kill-session -t "$session" 2>/dev/null || true
  tmux kill-session -t "$session-c" 2>/dev/null || true
  if [ "$failed" = 0 ]; then rm -rf "$work"; else echo "captures kept in $work" >&2; fi
}
trap cleanup EXIT

ok() { echo "ok:   $*"; }
bad() { echo "FAIL: $*"; failed=1; }

# Polls `cmd` every 0.2 s until it succeeds or `secs` have passed.
wait_for() { # secs, cmd...
  local until=$((SECONDS + $1)); shift
  until "$@"; do
    [ "$SECONDS" -lt "$until" ] || return 1
    sleep 0.2
  done
}

pane() { tmux display -p -t "$1" "alt=#{alternate_on} cursor=#{cursor_flag}"; }

# ---- 1. A whole run, captured every 0.2 s ---------------------------------------------------
n=5
tmux -u new-session -d -s "$session" -x 100 -y 40 \
  "LANG=C.UTF-8 '$bin' --live --instances $n --duration 10; echo \"exit=\$?\" > '$work/exit1'; sleep 600"
k=0
until [ -e "$work/exit1" ]; do
  k=$((k + 1))
  tmux capture-pane -p -t "$session" > "$work/cap-$(printf %04d $k).txt"
  if [ "$k" -gt 1500 ]; then bad "the run did not end within 300 s"; break; fi
  sleep 0.2
done
sleep 0.5
tmux capture-pane -p -t "$session" > "$work/after.txt"
state_after=$(pane "$session")
tmux kill-session -t "$session"

caps=("$work"/cap-*.txt)
# A capture of the view itself (not the shell before it starts).
view_caps=()
for c in "${caps[@]}"; do grep -q '^tonic-balancer live' "$c" && view_caps+=("$c"); done
[ "${#view_caps[@]}" -ge 10 ] && ok "${#view_caps[@]} captures of the view" \
  || bad "only ${#view_caps[@]} captures of the view"

row() { grep -E "^$2 +:[0-9]+ " "$1" || true; } # capture, instance
state_of() { row "$1" "$2" | awk '{print $3}'; }
share_of() { row "$1" "$2" | grep -oE '[0-9.]+%' | tr -d % || true; }

all_rows=no
for c in "${view_caps[@]}"; do
  missing=0
  for i in $(seq 0 $((n - 1))); do [ -n "$(row "$c" "i$i")" ] || missing=1; done
  if [ "$missing" = 0 ]; then all_rows=yes; break; fi
done
[ "$all_rows" = yes ] && ok "every instance's row (i0..i$((n - 1))) shows" \
  || bad "no capture shows every instance's row"

# The mean in flight, which the bar draws: the field before the share.
in_flight_of() { row "$1" "$2" | awk '{ for (i = 2; i <= NF; i++) if ($i ~ /%$/) print $(i - 1) }'; }
bars=$(for c in "${view_caps[@]}"; do in_flight_of "$c" i0; done | sort -u | wc -l)
[ "$bars" -ge 3 ] && ok "i0's bar moved: $bars different lengths" \
  || bad "i0's bar took only $bars different lengths"

# i1: ready, then failing or connecting (killed), then ready (restarted), in that order.
phase=0
zero_share=no
for c in "${view_caps[@]}"; do
  s=$(state_of "$c" i1)
  case "$phase:$s" in
    0:ready) phase=1 ;;
    1:failing | 1:connecting) phase=2 ;;
    2:ready) phase=3 ;;
  esac
  if [ "$phase" = 2 ] && [ "$(share_of "$c" i1)" = "0.0" ]; then zero_share=yes; fi
done
[ "$phase" -ge 2 ] && ok "the killed instance i1 went from ready to failing/connecting" \
  || bad "i1 never left ready after its kill (phase $phase)"
[ "$phase" = 3 ] && ok "i1 was ready again after its restart" \
  || bad "i1 was not ready again after its restart (phase $phase)"
[ "$zero_share" = yes ] && ok "i1 got 0.0% of the calls while killed" \
  || bad "i1's share never showed 0.0% while killed"

# i2: under 5% of the calls in some capture after its hang began.
low=no
for c in "${view_caps[@]}"; do
  grep -q '^\[x\].*i2 hangs' "$c" || continue
  s=$(share_of "$c" i2)
  [ -n "$s" ] && awk -v s="$s" 'BEGIN { exit !(s < 5) }' && { low=yes; break; }
done
[ "$low" = yes ] && ok "the hung instance i2 got under 5% of the calls" \
  || bad "i2's share never fell under 5% after it hung"

grep -q '^exit=0' "$work/exit1" && ok "exit status 0" || bad "exit: $(cat "$work/exit1")"
[ "$state_after" = "alt=0 cursor=1" ] && ok "terminal back after the run ($state_after)" \
  || bad "terminal after the run: $state_after"
grep -q 'done' "$work/after.txt" && [ -n "$(row "$work/after.txt" i0)" ] \
  && ok "the last picture stays on the screen" || bad "no last picture after the run"

# ---- 2. Ctrl-C -------------------------------------------------------------------------------
tmux -u new-session -d -s "$session-c" -x 100 -y 40 \
  "LANG=C.UTF-8 '$bin' --live --instances 3 --duration 30; echo \"exit=\$?\" > '$work/exit2'; sleep 600"
shows_view() { tmux capture-pane -p -t "$session-c" | grep -qE '^t +[0-9.]+ s of'; }
if wait_for 120 shows_view; then
  during=$(pane "$session-c")
  tmux send-keys -t "$session-c" C-c
  if wait_for 60 test -e "$work/exit2"; then
    sleep 0.3
    after=$(pane "$session-c")
    tmux capture-pane -p -t "$session-c" > "$work/ctrl-c.txt"
    [ "$during" = "alt=1 cursor=0" ] && ok "during the run: alternate screen, cursor hidden" \
      || bad "during the run: $during"
    grep -q '^exit=130' "$work/exit2" && ok "Ctrl-C: exit status 130" \
      || bad "Ctrl-C: $(cat "$work/exit2")"
    [ "$after" = "alt=0 cursor=1" ] && ok "Ctrl-C: terminal back ($after)" \
      || bad "Ctrl-C: terminal $after"
    grep -q 'live view stopped (Ctrl-C)' "$work/ctrl-c.txt" && ok "Ctrl-C: says it stopped" \
      || bad "Ctrl-C: no message"
  else
    bad "Ctrl-C did not end the run within 60 s"
  fi
else
  bad "the view did not show within 120 s"
fi
tmux kill-session -t "$session-c"

# ---- 3. Piped --------------------------------------------------------------------------------
"$bin" --live --instances 3 --duration 4 | cat > "$work/piped.txt"
if grep -q $'\x1b' "$work/piped.txt"; then bad "piped: escape sequences in the output"; else
  ok "piped: no escape sequence"; fi
grep -q 'event: i1 killed' "$work/piped.txt" && ok "piped: the events" || bad "piped: no event"
for i in 0 1 2; do
  grep -qE "^\[ *[0-9.]+ s\] i$i +:[0-9]+ " "$work/piped.txt" || bad "piped: no line for i$i"
done
grep -qE '^\[ *[0-9.]+ s\] i2 ' "$work/piped.txt" && ok "piped: every instance's line"

if [ "$failed" = 0 ]; then echo "live_check: all passed"; else echo "live_check: FAILED"; fi
exit "$failed"
