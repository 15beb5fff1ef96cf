"""Judging: the evaluator that makes inputs and references and decides verdicts (checks,
timing, statistics), and the worker that runs an implementation's code and nothing else.
The processes themselves are kept by `magpie.supervision`; the worker runs in `magpie.sandbox`."""
