"""Result files in the exact key layout `vllm bench serve --save-result --save-detailed`
writes (vllm/benchmarks/serve.py: main_async's setup keys, then benchmark()'s result
dict, then process_one_metric's mean/median/std/p<P> keys per selected metric).

Percentiles are computed with numpy exactly as vLLM does, independently of
k3infra.bench.results.percentile. Test inputs come from the receipt; nothing here is a
measured figure.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

PERCENTILES = (50.0, 99.0)


def receipt_latencies_ms(p50: float, p99: float, n: int = 3) -> list[float]:
    """n per-request latencies whose numpy p50/p99 equal (p50, p99) exactly: the
    middle value is p50, the largest is set so linear interpolation lands on p99."""
    assert n == 3
    rank = (n - 1) * 0.99                     # 1.98: between the 2nd and 3rd value
    top = p50 + (p99 - p50) / (rank - 1)
    return [p50 - 40.0, p50, top]


def result_dict(latencies_ms: Sequence[float], *, concurrency: Optional[int] = 8,
                input_lens: Optional[Sequence[int]] = None, output_len: int = 256,
                failed: int = 0, metadata: Optional[dict] = None,
                percentile_metrics: Sequence[str] = ("ttft", "tpot", "itl", "e2el"),
                detailed: bool = True) -> dict:
    n = len(latencies_ms) + failed
    lat_s = [v / 1000.0 for v in latencies_ms] + [0.0] * failed
    ok = [True] * len(latencies_ms) + [False] * failed
    input_lens = list(input_lens) if input_lens is not None else [35000 + i for i in range(n)]
    ttfts = [min(0.25 * v, 9.0) if s else 0.0 for v, s in zip(lat_s, ok)]
    itls = [[(v - t) / (output_len - 1)] * (output_len - 1) if s else []
            for v, t, s in zip(lat_s, ttfts, ok)]
    out_lens = [output_len if s else 0 for s in ok]
    duration = max(lat_s) + 0.5
    completed = sum(ok)
    data: dict = {
        "date": "20260729-120000", "endpoint_type": "openai", "backend": "openai",
        "label": None, "model_id": "/weights/moonshotai--Kimi-K3/rev",
        "tokenizer_id": "/weights/moonshotai--Kimi-K3/rev", "num_prompts": n,
    }
    data.update(metadata or {})
    data.update({"request_rate": "inf", "burstiness": 1.0, "max_concurrency": concurrency})
    total_in = sum(i for i, s in zip(input_lens, ok) if s)
    data.update({
        "duration": duration, "completed": completed, "failed": failed,
        "total_input_tokens": total_in, "total_output_tokens": sum(out_lens),
        "request_throughput": completed / duration, "request_goodput": None,
        "output_throughput": sum(out_lens) / duration,
        "total_token_throughput": (total_in + sum(out_lens)) / duration,
        "input_lens": input_lens, "output_lens": out_lens, "ttfts": ttfts, "itls": itls,
        "latencies": lat_s, "start_times": [100.0 + i for i in range(n)],
        "queue_times": [0.0] * n,
        "generated_texts": ["def f():\n    return 1\n" if s else "" for s in ok],
        "errors": ["" if s else "Internal Server Error" for s in ok],
        "max_output_tokens_per_s": 42.0, "max_concurrent_requests": min(n, concurrency or n),
        "rtfx": 0.0,
    })
    good = [v for v, s in zip(lat_s, ok) if s]
    series = {"ttft": [t for t, s in zip(ttfts, ok) if s],
              "tpot": [(v - t) / (output_len - 1) for v, t, s in zip(lat_s, ttfts, ok) if s],
              "itl": [x for row in itls for x in row], "e2el": good}
    for metric in percentile_metrics:
        values = series[metric]
        data[f"mean_{metric}_ms"] = float(np.mean(values or 0) * 1000)
        data[f"median_{metric}_ms"] = float(np.median(values or 0) * 1000)
        data[f"std_{metric}_ms"] = float(np.std(values or 0) * 1000)
        for p in PERCENTILES:
            data[f"p{int(p)}_{metric}_ms"] = float(np.percentile(values or 0, p) * 1000)
    if not detailed:
        for key in ("input_lens", "output_lens", "start_times", "ttfts", "itls",
                    "generated_texts", "errors"):
            del data[key]
    return data


def write_result(path: Path, data: dict) -> Path:
    path.write_text(json.dumps(data))
    return path
