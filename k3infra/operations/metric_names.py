"""The metric names k3infra's alerts and dashboard rely on (metric_names.yaml, with the
source each was checked against). Queries are written through `series()`, and a test
parses every query (real PromQL grammar) and holds the names it selects to this list.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib import resources

import yaml

# What prometheus_client appends to a registered name when it exposes the series.
_SUFFIXES = {"gauge": ("",), "counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}


@dataclass(frozen=True)
class MetricName:
    name: str          # as registered (`vllm:num_preemptions`)
    type: str          # gauge | counter | histogram
    source: str        # a key of `sources`
    help: str

    @property
    def exposed(self) -> tuple[str, ...]:
        """The series names a scrape returns for it."""
        return tuple(self.name + s for s in _SUFFIXES[self.type])


@functools.lru_cache(maxsize=None)
def catalogue() -> tuple[dict[str, str], dict[str, MetricName]]:
    """(sources, metrics by registered name) from metric_names.yaml."""
    doc = yaml.safe_load(resources.files(__package__).joinpath("metric_names.yaml").read_text())
    metrics = {}
    for name, spec in doc["metrics"].items():
        if spec["type"] not in _SUFFIXES:
            raise ValueError(f"metric_names.yaml: {name}: type {spec['type']!r} is not one of "
                             f"{sorted(_SUFFIXES)}")
        if spec["source"] not in doc["sources"]:
            raise ValueError(f"metric_names.yaml: {name}: source {spec['source']!r} is not "
                             f"listed under sources")
        metrics[name] = MetricName(name, spec["type"], spec["source"], spec["help"])
    return doc["sources"], metrics


def exposed_names() -> set[str]:
    """Every series name k3infra may query."""
    return {e for m in catalogue()[1].values() for e in m.exposed}


def series(name: str, part: str = "") -> str:
    """The exposed series name of a listed metric: `series('vllm:num_preemptions')` ->
    `vllm:num_preemptions_total`; histograms need `part` (`bucket`, `sum`, `count`).
    Queries are written through this, so a name missing from the catalogue fails when
    the rule is built, not when Prometheus evaluates it."""
    metric = catalogue()[1].get(name)
    if metric is None:
        raise KeyError(f"{name} is not in k3infra/operations/metric_names.yaml")
    if metric.type == "histogram":
        if part not in ("bucket", "sum", "count"):
            raise KeyError(f"{name} is a histogram: ask for its bucket, sum or count series")
        return f"{name}_{part}"
    if part:
        raise KeyError(f"{name} is a {metric.type}: it has no {part} series")
    return metric.exposed[0]
