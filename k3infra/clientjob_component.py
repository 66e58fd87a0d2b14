"""The Pulumi side of the one-shot client Jobs (k3infra/clientjob.py): the runtime
ConfigMap, the retained results claim, then the Job, which waits for both and for
whatever the caller names in `jobDependsOn` (the serving StatefulSet).

Every client Job component takes `(name, args, opts=None)` with args extending
`ClientJobArgs`; the component's own `opts.depends_on` is recorded on every child,
`jobDependsOn` on the Job alone (the ConfigMap and the claim do not wait for serving)."""
from __future__ import annotations

from typing import Callable, NotRequired, Optional, Required, Sequence, TypedDict, Union

import pulumi

from k3infra.clientjob import JobNames
from k3infra.componentargs import required
from k3infra.config import StackConfig
from k3infra.inputs import StackInputs, wired_build
from k3infra.kube import apply_built, apply_manifest, child_options
from k3infra.receipt import Receipt

# Scheduling and image start on top of the Job's own deadline.
WAIT_MARGIN_SECONDS = 600


class ClientJobArgs(TypedDict):
    receipt: Required[Receipt]      # the receipt the stack deploys
    config: Required[Union[StackConfig, StackInputs]]  # the validated stack config
    jobDependsOn: NotRequired[Sequence[pulumi.Resource]]   # what the Job alone waits for
                                                           # (serving ready, the Secrets)


class EndpointJobArgs(ClientJobArgs):
    """A client Job that talks to the stack's endpoint with the API key."""
    base: Required[str]             # object name prefix (the instance)
    namespace: Required[str]
    labels: Required[dict]
    baseUrl: Required[str]          # the endpoint the Job talks to
    apiKeySecret: Required[str]     # the Secret with the API key, and its key
    apiKeySecretKey: Required[str]
    servingSelector: Required[dict]   # the serving pods' labels


def endpoint_args(args: EndpointJobArgs, component: str) -> tuple[str, dict]:
    """The name prefix, and the endpoint keys as the Job builders' keywords (namespace,
    labels, base_url, api_key_secret, api_key_secret_key, serving_selector)."""
    keys = (("namespace", str), ("labels", dict), ("baseUrl", str), ("apiKeySecret", str),
            ("apiKeySecretKey", str), ("servingSelector", dict))
    snake = {"baseUrl": "base_url", "apiKeySecret": "api_key_secret",
             "apiKeySecretKey": "api_key_secret_key", "servingSelector": "serving_selector"}
    return (required(args, "base", component, str),
            {snake.get(k, k): required(args, k, component, t) for k, t in keys})


def common_args(args: ClientJobArgs, component: str) -> tuple[Receipt, StackInputs, list]:
    """The receipt, the inputs and the Job's dependencies of a client Job's args."""
    receipt = required(args, "receipt", component, Receipt)
    inputs = StackInputs.of(required(args, "config", component, (StackConfig, StackInputs),
                                     "the validated stack config"))
    return receipt, inputs, list(args.get("jobDependsOn", ()))


class ClientJob(pulumi.ComponentResource):
    """The runtime ConfigMap, the retained results claim, then the Job (replaced by
    delete-then-create: a fixed name cannot be created before the old Job is gone)."""

    job: pulumi.CustomResource
    results_claim: pulumi.Output[str]
    job_name: pulumi.Output[str]

    def _build(self, name: str, inputs: StackInputs, opts: Optional[pulumi.ResourceOptions], *,
               names: JobNames, runtime: Callable[[StackConfig], dict],
               claim: Callable[[StackConfig], dict], job: Callable[[StackConfig], dict],
               timeout_seconds: int, depends_on: Sequence[pulumi.Resource],
               job_name: Optional[pulumi.Output] = None, complete: bool = True) -> None:
        """`job_name`: a name known only at run time (the rollout gate's, from the digest
        of the template it judges); a new name replaces the Job. `complete=False`: the
        caller adds children after the Job and registers the outputs itself (the engine
        refuses a second registration of a component's outputs)."""
        runtime_cm = apply_built(f"{name}-runtime", inputs, runtime, child_options(self, opts))
        # The evidence outlives the stack: `pulumi destroy` leaves the claim in place.
        results = apply_built(f"{name}-results", inputs, claim,
                              child_options(self, opts, retain_on_delete=True))
        wait = f"{(timeout_seconds + WAIT_MARGIN_SECONDS) // 60}m"
        built = wired_build(inputs, job)
        if job_name is not None:
            built = pulumi.Output.all(built, job_name).apply(
                lambda a: {**a[0], "metadata": {**a[0]["metadata"], "name": a[1]}})
        self.job = apply_manifest(
            f"{name}-job", built,
            child_options(self, opts, *depends_on, runtime_cm, results, delete_before_replace=True,
                          custom_timeouts=pulumi.CustomTimeouts(create=wait, update=wait)),
            job(inputs.plain))
        self.results_claim = pulumi.Output.from_input(names.pvc)
        self.job_name = pulumi.Output.from_input(job_name if job_name is not None else names.job)
        if complete:
            self.register_outputs(self.job_outputs())

    def job_outputs(self) -> dict:
        return {"results_claim": self.results_claim, "job_name": self.job_name}
