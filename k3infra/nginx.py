"""The part of an nginx.conf every k3infra nginx shares: the authenticating API proxy
(k3infra.serving.proxy) and the in-cluster weights source (k3infra.weights.source_server)
run the same pinned image as a non-root user on a read-only root file system, so every
path nginx writes (pid, temp files) is under one writable directory."""
from __future__ import annotations

import math


def worker_processes(cpu_limit: float) -> int:
    """One worker per CPU of the container's limit (at least one): more workers than
    the cgroup's CPUs only contend for them."""
    return max(1, math.floor(cpu_limit))


def preamble(title: str, tmp_dir: str, worker_connections: int, cpu_limit: float) -> str:
    """From the header comment to the start of `http { ... }`, its access log included:
    the method and path only (no query string, no header, no body)."""
    return f"""# {title}
worker_processes {worker_processes(cpu_limit)};
pid {tmp_dir}/nginx.pid;
error_log stderr notice;
events {{ worker_connections {worker_connections}; }}
http {{
    server_tokens off;
    # No Authorization header, no query string, no body in the log.
    log_format k3 '$remote_addr "$request_method $uri" $status $body_bytes_sent $request_time';
    # nginx 1.22 opens the access log by path (`access_log stderr` is a file named
    # `stderr`), so /dev/stdout must be the container user's: runc chowns PID 1's stdio
    # to it (tests/test_serving_proxy.py shows both sides).
    access_log /dev/stdout k3;
    client_body_temp_path {tmp_dir}/client_body;
    proxy_temp_path {tmp_dir}/proxy;
    fastcgi_temp_path {tmp_dir}/fastcgi;
    uwsgi_temp_path {tmp_dir}/uwsgi;
    scgi_temp_path {tmp_dir}/scgi;
"""
