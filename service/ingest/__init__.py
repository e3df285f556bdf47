"""Receivers: the network edge where traces come in, and everything a request meets on the way in.

Owns: OTLP/HTTP and the JSON API (`http_receivers.py`), OTLP/gRPC (`grpc_receiver.py`), OTLP decoding and
screening (the rules and limits: `otlp.py`; protobuf: `otlp_protobuf.py`, `protobuf_wire.py`,
`value_scan.py`; OTLP/JSON: `otlp_json.py`; a body off the wire: `otlp_body.py`), what a request kept,
refused, dropped and truncated (`decoded.py`) and its log (`drop_log.py`), the span size limit and the cut
that makes a span fit it (`span_size.py`), decoded spans back to protobuf (`otlp_encode.py`), spans and
events redacted as they are decoded, with redaction on (`span_redaction.py`), the JSON API's wire schemas
(`wire.py`), the decode/build worker processes (`pool.py` on `loop_pool.py`), body limits (`limits.py`), API
keys and tenants (`auth.py`), refusals in the caller's encoding (`responses.py`), and `target.py`: the
interface the receivers hand accepted input to, which the pipeline implements.

May import: `assemble`, `redaction`, `conventions`, `consumer`, `metrics`, `config`, `model`, `errors` and the
process-level modules below them. Never `pipeline` or `api`: a receiver knows only `IngestTarget`.
"""
