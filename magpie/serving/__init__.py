"""Serving benchmarks: a load client with vLLM `bench serve` semantics.

One module per concern: `datasets` (what is asked), `endpoints` (the request body and the token
chunks of each OpenAI endpoint), `stream` (an SSE stream turned into per-request timings),
`http` (keep-alive HTTP/1.1 connections that feed the stream as bytes arrive), `load`
(arrivals, concurrency, warm-ups, the run), `metrics` (distributions, throughput, goodput),
`models` (pydantic config and result). `stub_server` is an OpenAI-compatible SSE server with
scripted delays, the peer the tests and `bench/serving_client.py` talk to.

Nothing here is imported by `import magpie`; numpy is imported only where numbers are computed.
"""
