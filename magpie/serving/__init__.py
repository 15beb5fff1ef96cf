"""Serving benchmarks: a load client with vLLM `bench serve` semantics.

One module per concern: `datasets` (what is asked), `endpoints` (the request body and the token
chunks of each OpenAI endpoint), `stream` (an SSE stream turned into per-request timings),
`http` (keep-alive HTTP/1.1 connections that feed the stream as bytes arrive), `load`
(arrivals, concurrency, warm-ups, the run), `metrics` (distributions, throughput, goodput),
`models` (pydantic config and result). `stub_server` is an OpenAI-compatible SSE server with
scripted delays, the peer the tests and `bench/serving_client.py` talk to.

Around the client: `engines` (one module per serving engine: its command line, health route,
port, and how it is asked for a fixed output length), `local` (the server as its own process
group: readiness, logs, shutdown), `docker_mode` (the server in a container of the engine's image;
`images.yaml` names them, `env_image` builds one of this Python environment offline), `runner`
(one benchmark, start to `benchmark_report.json`), `report` (its pydantic config and report),
`tiny_model` (a random model built offline for tests), `sweep` / `sweep_plot` (with `manifest.sweep_axes`) (a benchmark swept over
loads against one server: InferenceMAX's keys with intervals, the table and the Pareto plot).

Nothing here is imported by `import magpie`; numpy is imported only where numbers are computed.
"""
