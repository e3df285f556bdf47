"""Receivers: the network edge where traces come in, and everything a request meets on the way in.

Owns: OTLP/HTTP and the JSON API (`http_receivers.py`), OTLP/gRPC (`grpc_receiver.py`), OTLP decoding
and screening (`otlp.py`, `protobuf_wire.py`), the JSON API's wire schemas (`wire.py`), the decode/build
worker processes (`pool.py` on `loop_pool.py`), body limits (`limits.py`), API keys and tenants
(`auth.py`), refusals in the caller's encoding (`responses.py`), and `target.py`: the interface the
receivers hand accepted input to, which the pipeline implements.

May import: `assemble`, `conventions`, `consumer`, `metrics`, `config`, `model`, `errors` and the
process-level modules below them. Never `pipeline` or `api`: a receiver knows only `IngestTarget`.
"""
