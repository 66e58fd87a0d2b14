"""The accuracy smoke test: lm-eval against the deployed endpoint (runner.py), its
judgement against the receipt's baseline (compare.py), and the AccuracySmoke Job
(manifests.py, component.py). Labelled "smoke test" everywhere: it shows the endpoint
answers like the model should, it is not a benchmark claim."""
