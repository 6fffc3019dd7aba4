# The many-clients scenario's floor for clients that do not see each other's calls
# (docs/design.md, "The many-clients scenario"): each instance gets Poisson arrivals
# (rate lam per s); a call's service time is base + per_call * (calls in flight at its start),
# as the fleet's Overload behaviour. Prints p50/p99 of service times (ms), no client overhead.
# Run: python3 scripts/many_clients_floor.py
# 50 clients taking turns over 20 instances, each at 40 calls/s: what reaches one instance is the
# sum of 50 independent streams, close to Poisson.
import random, heapq
def run(lam, n_calls, base=5.0, per=2.0, seed=1):
    rnd = random.Random(seed)
    t = 0.0; ends = []; out = []
    for _ in range(n_calls):
        t += rnd.expovariate(lam / 1000.0)
        while ends and ends[0] <= t: heapq.heappop(ends)
        s = base + per * len(ends)
        heapq.heappush(ends, t + s); out.append(s)
    out.sort()
    return out[len(out)//2], out[int(len(out)*0.99)]
for lam in (100, 105, 110, 125):
    print(lam, "calls/s: p50 %.1f p99 %.1f" % run(lam, 200000))
