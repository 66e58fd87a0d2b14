"""Routing benchmark (issue 22): round robin vs prefix-aware routing over 3 simulated
replicas on loopback, with Workload-A-like shared-prefix traffic. Prints figures; it is
not a timed test.

    /work/main/.venv/bin/python benchmarks/gateway_bench.py [--rounds 5] [--requests 150]

What runs (all on 127.0.0.1, stdlib asyncio only):

- **3 simulated replicas**: small HTTP servers speaking the OpenAI completions route
  (`POST /v1/completions` with `prompt` as a list of token ids, as vLLM accepts) and
  `GET /metrics` (`vllm:num_requests_waiting`, `vllm:num_requests_running`,
  `vllm:kv_cache_usage_perc`, `vllm:cache_config_info`). Each keeps a prefix cache of
  16-token blocks (vLLM's block size) chained by hash, LRU-evicted at a fixed capacity;
  a request's cached prefix is its leading run of cached blocks. Prefill is charged only
  for the tokens after that run, at a fixed rate, one prefill at a time per replica
  (the GPU), and requests queue for it (the waiting count the metrics report). The
  response (usage with `prompt_tokens_details.cached_tokens`, as vLLM reports it) is
  sent when the first token would be: the client's wall time to it is the TTFT.
- **Routers**, in the client process: `round-robin` (what a Kubernetes Service does),
  `prefix-aware` (a stand-in of llm-d-router's endpoint picker, the pinned EPP:
  k3infra/gateway/picker.py's config), and `repo-sticky` (hashes the true repository
  id: a reference for perfect affinity with no load awareness, which no real router
  knows).
- **The EPP stand-in**, faithful to llm-d-router v0.10.0's default profile: prompt
  token ids hashed in chained 64-token blocks (the producer's block size: vLLM's 16
  auto-tuned from the metrics, clamped to its 64 minimum), at most 131072 tokens; an
  approximate index of which replica was *sent* each block (recorded after picking,
  LRU per replica with the auto-tuned capacity = the replica's num_gpu_blocks counted
  in the producer's blocks, as its makeserver does); the longest-prefix walk of its
  matchLongestPrefix (stops at the first block no replica has); scores: prefix
  matched/total blocks (weight 3), queue min-max normalized on scraped
  `num_requests_waiting` (weight 2, all equal -> 1.0), KV cache 1 - usage (weight 2);
  max-score pick with random tie-break; metrics scraped over HTTP every 50 ms (its
  refresh-metrics-interval). Its decision time (Python here) is part of the TTFT. Not
  modelled: the Envoy hop and ext_proc latency, the Go picker's own CPU time, tokenization (the stand-in sees the same token ids as the
  replica; the real picker without a tokenizer estimates tokens from characters).

Workload (Workload-A-like, seeded): repository contexts of ~32K tokens shared by many
requests (popularity Zipf 1.0), each request = one context + a unique 1-4K-token
question (~35K tokens), Poisson arrivals. Each round replays the same requests under
each router against fresh replicas. Figures: mean and p99 TTFT, token cache-hit rate,
per replica request share; medians over rounds with min-max; the harness floor (a
round with no prefill charge) and the ideal (only the unique suffix charged, no queue);
the load average before and after.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import statistics
import time
from collections import OrderedDict
from dataclasses import dataclass, field

HOST = "127.0.0.1"
VLLM_BLOCK = 16                 # vLLM's KV block (tokens)
EPP_MIN_BLOCK = 64              # the picker's producer clamps smaller block sizes to this
EPP_MAX_TOKENS = 131072         # maxPrefixTokensToMatch default
EPP_REFRESH_S = 0.05            # refresh-metrics-interval default
WEIGHTS = {"queue": 2, "kv": 2, "prefix": 3}   # the default profile's scorer weights


# --- the simulated replica ---------------------------------------------------------------

def block_hashes(tokens: list[int], size: int, limit: int | None = None) -> list[int]:
    """Chained hashes of the full blocks: each covers the whole prefix up to its end."""
    out, prev = [], 0
    n = len(tokens) // size
    if limit is not None:
        n = min(n, limit)
    for i in range(n):
        prev = hash((prev, tuple(tokens[i * size:(i + 1) * size])))
        out.append(prev)
    return out


@dataclass
class Replica:
    name: str
    capacity_blocks: int
    prefill_s_per_token: float
    first_token_s: float
    cache: OrderedDict = field(default_factory=OrderedDict)
    waiting: int = 0
    running: int = 0
    running_tokens: int = 0
    gpu: asyncio.Lock = field(default_factory=asyncio.Lock)
    server: asyncio.AbstractServer | None = None
    port: int = 0

    def cached_prefix_blocks(self, hashes: list[int]) -> int:
        n = 0
        for h in hashes:
            if h not in self.cache:
                break
            n += 1
        return n

    def insert(self, hashes: list[int]) -> None:
        for h in hashes:
            if h in self.cache:
                self.cache.move_to_end(h)
            else:
                self.cache[h] = True
                if len(self.cache) > self.capacity_blocks:
                    self.cache.popitem(last=False)

    async def complete(self, tokens: list[int]) -> dict:
        hashes = block_hashes(tokens, VLLM_BLOCK)
        self.waiting += 1
        async with self.gpu:
            self.waiting -= 1
            self.running += 1
            self.running_tokens += len(tokens)
            # The prefix is looked up when the request is scheduled (vLLM's scheduler).
            cached = self.cached_prefix_blocks(hashes) * VLLM_BLOCK
            unseen = len(tokens) - cached
            await asyncio.sleep(unseen * self.prefill_s_per_token + self.first_token_s)
            self.insert(hashes)
            self.running -= 1
            self.running_tokens -= len(tokens)
        return {"object": "text_completion", "choices": [{"index": 0, "text": "x"}],
                "usage": {"prompt_tokens": len(tokens), "completion_tokens": 1,
                          "prompt_tokens_details": {"cached_tokens": cached}}}

    def metrics(self) -> str:
        usage = min(1.0, self.running_tokens / (self.capacity_blocks * VLLM_BLOCK))
        return (f"vllm:num_requests_waiting {self.waiting}\n"
                f"vllm:num_requests_running {self.running}\n"
                f"vllm:kv_cache_usage_perc {usage}\n"
                f'vllm:cache_config_info{{block_size="{VLLM_BLOCK}",'
                f'num_gpu_blocks="{self.capacity_blocks}"}} 1\n')

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            line, *headers = head.decode().split("\r\n")
            method, path, _ = line.split(" ", 2)
            length = next((int(h.split(":", 1)[1]) for h in headers
                           if h.lower().startswith("content-length:")), 0)
            body = await reader.readexactly(length) if length else b""
            if method == "POST" and path == "/v1/completions":
                out = json.dumps(await self.complete(json.loads(body)["prompt"])).encode()
                ctype = "application/json"
            elif method == "GET" and path == "/metrics":
                out, ctype = self.metrics().encode(), "text/plain"
            else:
                out, ctype = b"not found", "text/plain"
            status = "404 Not Found" if out == b"not found" else "200 OK"
            writer.write(f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: "
                         f"{len(out)}\r\nConnection: close\r\n\r\n".encode() + out)
            await writer.drain()
        finally:
            writer.close()

    async def start(self) -> None:
        self.server = await asyncio.start_server(self.handle, HOST, 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        self.server.close()
        await self.server.wait_closed()


async def http(port: int, method: str, path: str, body: bytes = b"") -> bytes:
    reader, writer = await asyncio.open_connection(HOST, port)
    writer.write(f"{method} {path} HTTP/1.1\r\nHost: {HOST}\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
    await writer.drain()
    data = await reader.read()
    writer.close()
    return data.split(b"\r\n\r\n", 1)[1]


# --- routers ------------------------------------------------------------------------------

class RoundRobin:
    name = "round-robin"

    def __init__(self, replicas: list[Replica], rng: random.Random):
        self.replicas, self.i = replicas, -1

    def pick(self, req: "Request") -> Replica:
        self.i = (self.i + 1) % len(self.replicas)
        return self.replicas[self.i]


class RepoSticky:
    """Perfect affinity on the true repository id (a reference, not a real router)."""
    name = "repo-sticky"

    def __init__(self, replicas: list[Replica], rng: random.Random):
        self.replicas = replicas

    def pick(self, req: "Request") -> Replica:
        return self.replicas[req.repo % len(self.replicas)]


class PrefixAware:
    """A stand-in of the endpoint picker's default profile (the module docstring)."""
    name = "prefix-aware"

    def __init__(self, replicas: list[Replica], rng: random.Random):
        self.replicas, self.rng = replicas, rng
        self.scraped = {r.name: {"waiting": 0.0, "kv": 0.0, "block_size": VLLM_BLOCK,
                                 "num_blocks": 0} for r in replicas}
        self.index: dict[str, OrderedDict] = {r.name: OrderedDict() for r in replicas}
        self.task: asyncio.Task | None = None

    async def scrape_forever(self) -> None:
        while True:
            for r in self.replicas:
                text = (await http(r.port, "GET", "/metrics")).decode()
                s = self.scraped[r.name]
                for line in text.splitlines():
                    name, value = line.rsplit(" ", 1)
                    if name == "vllm:num_requests_waiting":
                        s["waiting"] = float(value)
                    elif name == "vllm:kv_cache_usage_perc":
                        s["kv"] = float(value)
                    elif name.startswith("vllm:cache_config_info"):
                        labels = dict(kv.split("=") for kv in name[name.index("{") + 1:-1].split(","))
                        s["block_size"] = int(labels["block_size"].strip('"'))
                        s["num_blocks"] = int(labels["num_gpu_blocks"].strip('"'))
            await asyncio.sleep(EPP_REFRESH_S)

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self.scrape_forever())

    async def stop(self) -> None:
        self.task.cancel()
        try:
            await self.task
        except asyncio.CancelledError:
            pass

    def pick(self, req: "Request") -> Replica:
        block = max(self.scraped[self.replicas[0].name]["block_size"], EPP_MIN_BLOCK)
        hashes = block_hashes(req.tokens, block, EPP_MAX_TOKENS // block)
        matched = {r.name: 0 for r in self.replicas}
        for h in hashes:                       # matchLongestPrefix
            holders = [name for name, idx in self.index.items() if h in idx]
            if not holders:
                break
            for name in holders:
                matched[name] += 1
        waits = [self.scraped[r.name]["waiting"] for r in self.replicas]
        lo, hi = min(waits), max(waits)
        scored = []
        for r in self.replicas:
            s = self.scraped[r.name]
            queue = 1.0 if hi == lo else (hi - s["waiting"]) / (hi - lo)
            prefix = matched[r.name] / len(hashes) if hashes else 0.0
            score = (WEIGHTS["queue"] * queue + WEIGHTS["kv"] * (1.0 - s["kv"])
                     + WEIGHTS["prefix"] * prefix)
            scored.append((score, self.rng.random(), r))
        best = max(scored, key=lambda t: (t[0], t[1]))[2]
        # PreRequest: record what was sent where; capacity auto-tuned from num_gpu_blocks.
        idx = self.index[best.name]
        capacity = self.scraped[best.name]["num_blocks"] or 31250
        for h in hashes:
            if h in idx:
                idx.move_to_end(h)
            else:
                idx[h] = True
                if len(idx) > capacity:
                    idx.popitem(last=False)
        return best


ROUTERS = {"round-robin": RoundRobin, "prefix-aware": PrefixAware, "repo-sticky": RepoSticky}


# --- workload -----------------------------------------------------------------------------

@dataclass
class Request:
    at: float          # arrival offset, s
    repo: int
    tokens: list[int]
    suffix: int        # unique tokens at the end


def workload(seed: int, n: int, repos: int, context: int, rate: float) -> list[Request]:
    rng = random.Random(seed)
    contexts = [[rng.randrange(1, 150000) for _ in range(context + rng.randrange(-4000, 2000))]
                for _ in range(repos)]
    zipf = [1.0 / (k + 1) for k in range(repos)]
    out, t = [], 0.0
    for i in range(n):
        t += rng.expovariate(rate)
        repo = rng.choices(range(repos), weights=zipf)[0]
        suffix = rng.randrange(1000, 4000)
        out.append(Request(t, repo, contexts[repo] + [rng.randrange(1, 150000)
                                                       for _ in range(suffix)], suffix))
    return out


# --- a run --------------------------------------------------------------------------------

@dataclass
class Result:
    router: str
    ttft: list[float]
    cached: int
    prompt: int
    share: list[int]

    @property
    def hit_rate(self) -> float:
        return self.cached / self.prompt

    @property
    def mean(self) -> float:
        return statistics.fmean(self.ttft)

    @property
    def p99(self) -> float:
        xs = sorted(self.ttft)
        return xs[min(len(xs) - 1, math.ceil(0.99 * len(xs)) - 1)]


async def run(router_name: str, reqs: list[Request], args, seed: int,
              prefill_s_per_token: float) -> Result:
    replicas = [Replica(f"r{i}", args.cache_tokens // VLLM_BLOCK, prefill_s_per_token,
                        args.first_token_ms / 1000) for i in range(args.replicas)]
    for r in replicas:
        await r.start()
    router = ROUTERS[router_name](replicas, random.Random(seed))
    if isinstance(router, PrefixAware):
        router.start()
        await asyncio.sleep(2 * EPP_REFRESH_S)        # first scrape
    bodies = [json.dumps({"model": "kimi-k3", "prompt": q.tokens, "max_tokens": 1}).encode()
              for q in reqs]
    ttft: list[float] = []
    cached = prompt = 0
    share = {r.name: 0 for r in replicas}

    async def one(q: Request, body: bytes) -> None:
        nonlocal cached, prompt
        t0 = time.perf_counter()           # the routing decision is on the request's path
        target = router.pick(q)
        share[target.name] += 1
        out = json.loads(await http(target.port, "POST", "/v1/completions", body))
        ttft.append(time.perf_counter() - t0)
        cached += out["usage"]["prompt_tokens_details"]["cached_tokens"]
        prompt += out["usage"]["prompt_tokens"]

    start = time.perf_counter()
    tasks = []
    for q, body in zip(reqs, bodies):
        delay = start + q.at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(q, body)))
    await asyncio.gather(*tasks)
    if isinstance(router, PrefixAware):
        await router.stop()
    for r in replicas:
        await r.stop()
    return Result(router_name, ttft, cached, prompt, list(share.values()))


def med(xs: list[float]) -> str:
    return f"{statistics.median(xs):8.1f} [{min(xs):.1f}-{max(xs):.1f}]"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--requests", type=int, default=150, help="per round and router")
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--repos", type=int, default=12, help="distinct repository contexts")
    p.add_argument("--context-tokens", type=int, default=32000)
    p.add_argument("--cache-tokens", type=int, default=200000,
                   help="prefix cache per replica (tokens): fewer than all contexts together")
    p.add_argument("--prefill-ms-per-1k", type=float, default=6.0,
                   help="prefill charge per 1K unseen tokens (wall ms)")
    p.add_argument("--first-token-ms", type=float, default=5.0)
    p.add_argument("--load", type=float, default=0.6,
                   help="arrival rate as a fraction of the replicas' all-miss capacity")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    per_token = args.prefill_ms_per_1k / 1000 / 1000
    full_prompt = args.context_tokens + 2500
    cold_s = full_prompt * per_token + args.first_token_ms / 1000
    rate = args.load * args.replicas / cold_s
    load_before = os.getloadavg()
    print(f"gateway routing benchmark: {args.replicas} simulated replicas on {HOST}, "
          f"{args.rounds} rounds x {args.requests} requests per router")
    print(f"workload: {args.repos} repository contexts of ~{args.context_tokens} tokens "
          f"(Zipf 1.0) + a unique 1-4K-token question; Poisson {rate:.1f} req/s "
          f"({args.load:.0%} of the all-miss capacity); prefix cache {args.cache_tokens} "
          f"tokens per replica; prefill {args.prefill_ms_per_1k} ms / 1K unseen tokens "
          f"(a cold ~{full_prompt // 1000}K prompt: {cold_s * 1000:.0f} ms)")
    print(f"machine: {os.cpu_count()} CPUs, load average before {load_before[0]:.2f} "
          f"{load_before[1]:.2f} {load_before[2]:.2f}")

    names = list(ROUTERS)
    per: dict[str, list[Result]] = {n: [] for n in names}
    floor: list[Result] = []
    ideal: list[float] = []
    for rnd in range(args.rounds):
        seed = args.seed + rnd
        reqs = workload(seed, args.requests, args.repos, args.context_tokens, rate)
        ideal.append(statistics.fmean(q.suffix * per_token + args.first_token_ms / 1000
                                      for q in reqs))
        order = names if rnd % 2 == 0 else names[::-1]    # no router always runs first
        for n in order:
            per[n].append(asyncio.run(run(n, reqs, args, seed, per_token)))
        floor.append(asyncio.run(run("round-robin", reqs, args, seed, 0.0)))
        print(f"round {rnd + 1}: " + ", ".join(
            f"{n} mean {per[n][-1].mean * 1000:.0f} ms hit {per[n][-1].hit_rate:.0%}"
            for n in names), flush=True)

    load_after = os.getloadavg()
    print()
    print(f"{'router':14} {'mean TTFT ms':>24} {'p99 TTFT ms':>24} {'cache hit %':>22} "
          f"{'mean / ideal':>13}  requests per replica (round 1)")
    ideal_ms = statistics.median(ideal) * 1000
    for n in names:
        rs = per[n]
        means = [r.mean * 1000 for r in rs]
        print(f"{n:14} {med(means):>24} {med([r.p99 * 1000 for r in rs]):>24} "
              f"{med([r.hit_rate * 100 for r in rs]):>22} "
              f"{statistics.median(means) / ideal_ms:13.2f}  {rs[0].share}")
    rr = statistics.median([r.mean for r in per["round-robin"]])
    pa = statistics.median([r.mean for r in per["prefix-aware"]])
    rr99 = statistics.median([r.p99 for r in per["round-robin"]])
    pa99 = statistics.median([r.p99 for r in per["prefix-aware"]])
    print()
    print(f"prefix-aware vs round-robin (medians over {args.rounds} rounds): mean TTFT "
          f"{pa * 1000:.1f} vs {rr * 1000:.1f} ms ({pa / rr - 1:+.0%}), p99 {pa99 * 1000:.1f} vs "
          f"{rr99 * 1000:.1f} ms ({pa99 / rr99 - 1:+.0%})")
    print(f"ideal (only the unique question charged, no queue): {ideal_ms:.1f} ms mean; "
          f"harness floor (no prefill charge, round robin): "
          f"{statistics.median([r.mean * 1000 for r in floor]):.1f} ms mean, "
          f"p99 {statistics.median([r.p99 * 1000 for r in floor]):.1f} ms")
    print(f"load average after {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}")


if __name__ == "__main__":
    main()
