"""Span conventions: what the attributes of a span mean, whichever library wrote them.

Owns: the decoded span (`spans.py`), the attribute names by convention (`attributes.py`) and their typed
values (`attribute_values.py`), which RAG stage a span is (`stage.py`), what it carries (`content.py`),
model-call usage (`usage.py`), prices (`pricing.py`, `prices.json`), the user hash (`user_hash.py`), and
`semconv.py`: the spans of one
trace -> one `RagTrace` (OpenInference, OTel GenAI, OpenLLMetry), with the spans joined to their log
events (`joined_spans.py`) and the retrieved chunks merged, named and deduplicated (`retrieved_chunks.py`).

May import: `model` and `errors` only. Add a new instrumentation library's attributes here.
"""
