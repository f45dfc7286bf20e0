"""The simulator as it was before the engine, on a serve-bench sweep's traffic and fitted step times.

    git archive 278a6bf minispec | tar -x -C /tmp/before     # the package at the layout, before the engine
    PYTHONPATH=/tmp/before python scripts/simulator_before.py results/cpu/engine_load

That simulator reserved each request's prompt + output at admission and prefilled before decoding. It runs the
sweep's plain, gamma 4 and EAGLE gamma 4 rows again (the same requests, acceptance by position and step times,
read from PREFIX.jsonl and PREFIX_steps.json), prints them beside the measured rows and the simulator of now, and
writes PREFIX_before.jsonl.
"""
import json
import sys
from dataclasses import replace

import numpy as np

from minispec import serving

rows = [json.loads(line) for line in open(sys.argv[1] + ".jsonl")]
fitted = json.loads(open(sys.argv[1] + "_steps.json").read())

class Fitted:
    def __init__(self, d):
        self.t = {}
        for B, w, s in d["step_s"]:
            self.t.setdefault(w, []).append((B, s))
        self.pre = d["prefill_s"]
    def _at(self, B, w):
        ws = sorted(self.t)
        vals = [np.interp(B, *zip(*sorted(self.t[x]))) for x in ws]
        return float(np.interp(w, ws, vals))
    def plain(self, ctx): return self._at(len(ctx), 1)
    def speculative(self, ctx, g): return self._at(len(ctx), g + 1)
    def prefill(self, batch, tokens, draft=False): return float(np.interp(batch * tokens, *zip(*self.pre)))
    def kv_budget(self, draft=False): return None

meas = [r for r in rows if r["source"] == "measured" and r["setting"] in ("plain", "gamma 4", "EAGLE gamma 4")]
new = {(r["setting"], r["rate"]): r for r in rows if r["source"] == "simulated"}
print(f"{'rate':>5} {'setting':>14} | {'measured':>28} | {'simulated now':>28} | {'simulated before':>28}")
print(f"{'':>5} {'':>14} | {'TPOT p50, TTFT p99, tok/s':>28} | {'':>28} | {'(reservations, prefill first)':>28}")
out = []
for m in meas:
    rate, n = m["rate"], m["requests"]
    mix = (serving.Traffic("code", 0.0, 1.0, serving.Lengths(64, "uniform"), serving.Lengths(64, "uniform")),)
    sims = serving.poisson_requests(serving.Workload(rate=rate, duration_s=(2 * n + 10) / rate, mix=mix, seed=0))[:n]
    shares = tuple(m["per_position_acceptance_rates"])
    alpha = serving.conditional(shares) if shares and min(shares) > 0 else 0.0
    g = 0 if m["setting"] == "plain" else 4
    run = serving.simulate([replace(r, alpha=alpha) for r in sims], Fitted(fitted[m["setting"]]), g,
                           serving.Scheduler(max_rows=64, max_batched_tokens=2048, kv_tokens=64 * 17 * 16))
    s = run.summary(m["tpot_slo_s"], m["ttft_slo_s"])
    f = lambda r: f"{1e3 * r['tpot_p50_s']:6.1f} ms {r['ttft_p99_s']:6.2f} s {r['throughput']:6.0f}"
    print(f"{rate:>5g} {m['setting']:>14} | {f(m):>28} | {f(new[(m['setting'], rate)]):>28} | {f(s):>28}")
    out.append({"setting": m["setting"], "rate": rate, "source": "simulated before (reservations, prefill first)"} | s)
with open(sys.argv[1] + "_before.jsonl", "w") as fh:
    fh.writelines(json.dumps(r) + "\n" for r in out)
