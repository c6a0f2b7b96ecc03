#!/usr/bin/python3
"""Generate vllm_parity.json: synthetic request outputs plus the metrics that
vLLM's `calculate_metrics` (vllm/benchmarks/serve.py) computes from them with
numpy. The Go test feeds the same outputs to package stats and compares.

The metric code below follows vLLM's calculate_metrics line for line (TTFT,
TPOT excluding the first token, pooled ITL, E2EL, goodput with `s >= r`,
one-second buckets for max_output_tokens_per_s and max_concurrent_requests),
except that the tokenizer fallback is not needed (output_tokens always set).

Regenerate: /usr/bin/python3 vllm_parity.py > vllm_parity.json
"""
import json

import numpy as np

rng = np.random.default_rng(7)
N = 300
outputs = []
t = 0.0
for i in range(N):
    t += rng.exponential(0.05)
    success = rng.random() > 0.1
    prompt_len = int(rng.integers(100, 2000))
    if not success:
        outputs.append(dict(success=False, start_time=t, prompt_len=prompt_len, ttft=0.0, itl=[], latency=0.0,
                            output_tokens=0))
        continue
    out = int(rng.integers(1, 60))
    chunks = out if rng.random() > 0.3 else max(1, out // 4)  # stream_interval packs tokens
    ttft = float(rng.gamma(2.0, 0.08))
    itl = [float(x) for x in rng.gamma(1.5, 0.012, size=chunks - 1)]
    if chunks > 3 and rng.random() < 0.2:
        itl[1] = 0.0  # an empty/instant chunk
    latency = ttft + sum(itl)
    outputs.append(dict(success=True, start_time=t, prompt_len=prompt_len, ttft=ttft, itl=itl, latency=latency,
                        output_tokens=out))

goodput = {"ttft": 300.0, "tpot": 30.0}
percentiles = [50.0, 90.0, 99.0, 99.9]
dur_s = max(o["start_time"] + o["latency"] for o in outputs) - outputs[0]["start_time"]

actual_output_lens, total_input, completed, good_completed = [], 0, 0, 0
itls, tpots, all_tpots, ttfts, e2els = [], [], [], [], []
for o in outputs:
    if o["success"]:
        output_len = o["output_tokens"]
        actual_output_lens.append(output_len)
        total_input += o["prompt_len"]
        tpot = 0
        if output_len > 1:
            tpot = (o["latency"] - o["ttft"]) / (output_len - 1)
            tpots.append(tpot)
        all_tpots.append(tpot)
        itls += o["itl"]
        ttfts.append(o["ttft"])
        e2els.append(o["latency"])
        completed += 1
    else:
        actual_output_lens.append(0)
valid, slo = [ttfts, all_tpots], [goodput["ttft"] / 1000, goodput["tpot"] / 1000]
for m in zip(*valid):
    if all(s >= r for s, r in zip(slo, m)):
        good_completed += 1

ok = [o for o in outputs if o["success"]]
min_start = min(o["start_time"] for o in ok)
max_end = max(o["start_time"] + o["latency"] for o in ok)
nb = int(np.ceil(max_end - min_start)) + 1
tps, conc = np.zeros(nb), np.zeros(nb)
for o in ok:
    times = [o["start_time"] + o["ttft"]]
    cur = times[0]
    for x in o["itl"]:
        cur += x
        times.append(cur)
    for tt in times:
        b = int(tt - min_start)
        if 0 <= b < nb:
            tps[b] += 1
    for s in range(int(o["start_time"] - min_start), int(o["start_time"] + o["latency"] - min_start) + 1):
        conc[s] += 1

res = dict(completed=completed, failed=len(outputs) - completed, total_input_tokens=total_input,
           total_output_tokens=sum(actual_output_lens), request_throughput=completed / dur_s,
           request_goodput=good_completed / dur_s, output_throughput=sum(actual_output_lens) / dur_s,
           total_token_throughput=(total_input + sum(actual_output_lens)) / dur_s,
           max_output_tokens_per_s=float(np.max(tps)), max_concurrent_requests=int(np.max(conc)))
for name, xs in [("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2el", e2els)]:
    res[f"mean_{name}_ms"] = float(np.mean(xs or 0) * 1000)
    res[f"std_{name}_ms"] = float(np.std(xs or 0) * 1000)
    res[f"median_{name}_ms"] = float(np.median(xs or 0) * 1000)
    for p in percentiles:
        word = str(int(p)) if int(p) == p else str(p)
        res[f"p{word}_{name}_ms"] = float(np.percentile(xs or 0, p) * 1000)

print(json.dumps(dict(goodput=goodput, percentiles=percentiles, duration=dur_s, outputs=outputs, vllm=res), indent=1))
