#!/usr/bin/env python3
"""How often the interval rules of outlier ejection eject an instance by chance alone.

Every instance answers the same share of application errors (NOT_FOUND, ...), so none is an
outlier; each rule is run over many simulated intervals and the share of intervals in which it
would eject some instance is printed, for gRPC's success-rate rule as gRFC A50 writes it (mean
minus 1.9 standard deviations of the instances' success rates) and for the channel's (the same,
below 95%, and failure rates that differ beyond chance from the other instances': see
`src/health/sweep.rs`). Then a real outlier, to show that the guard still lets it be found.
The table it prints is in docs/design.md.

    python3 scripts/outlier_false_positives.py [intervals]
"""
import math
import random
import sys


def kl(q, p):
    """Kullback-Leibler divergence of Bernoulli(q) from Bernoulli(p)."""
    p = min(max(p, 1e-12), 1 - 1e-12)
    d = 0.0
    if q > 0:
        d += q * math.log(q / p)
    if q < 1:
        d += (1 - q) * math.log((1 - q) / (1 - p))
    return d


def beyond_chance(f, n, fo, no):
    """The channel's guard: the instance fails more often than the others, and the G-test
    (likelihood ratio) of one failure rate for both rejects it at one in a million."""
    if n == 0 or no == 0:
        return True
    q, qo = f / n, fo / no
    p = (f + fo) / (n + no)
    return q > qo and 2 * (n * kl(q, p) + no * kl(qo, p)) >= 23.93


def rules(fails, calls):
    """(A50 success rate ejects some instance, the channel's success rate does)."""
    rates = [1 - f / n for f, n in zip(fails, calls)]
    k = len(rates)
    mean = sum(rates) / k
    sd = math.sqrt(sum((r - mean) ** 2 for r in rates) / k)
    floor = mean - 1.9 * sd
    a50 = any(r < floor for r in rates)
    ours = any(
        r < floor
        and r < 0.95
        and beyond_chance(f, n, sum(fails) - f, sum(calls) - n)
        for r, f, n in zip(rates, fails, calls)
    )
    return a50, ours


def run(k, n, p, intervals, outlier=None):
    rng = random.Random(1)
    a50 = ours = 0
    for _ in range(intervals):
        ps = [p] * k
        if outlier is not None:
            ps[0] = outlier
        fails = [sum(rng.random() < q for _ in range(n)) for q in ps]
        a, o = rules(fails, [n] * k)
        a50 += a
        ours += o
    return a50 / intervals, ours / intervals


def main():
    intervals = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    print("| instances | calls each | errors | outlier's | A50 ejects some instance | the channel does |")
    print("| --- | --- | --- | --- | --- | --- |")
    for calls in (25, 100):
        for k in (5, 20):
            for p in (0.01, 0.1, 0.3):
                a, o = run(k, calls, p, intervals)
                print(f"| {k} | {calls} | {p:.0%} | - | {a:.1%} | {o:.2%} |")
    for k, p, q in ((5, 0.0, 0.1), (5, 0.01, 0.2), (5, 0.1, 1.0), (20, 0.1, 0.3), (20, 0.3, 0.6)):
        a, o = run(k, 100, p, intervals, outlier=q)
        print(f"| {k} | 100 | {p:.0%} | {q:.0%} | {a:.1%} | {o:.2%} |")


if __name__ == "__main__":
    main()
