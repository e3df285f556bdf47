"""ragmon service: ingest, assembly, bus, store, metrics, API."""

from service.model import Chunk, Feedback, ModelUsage, QueryEmbedding, RagTrace, Retrieval, Timings

__all__ = ["Chunk", "Feedback", "ModelUsage", "QueryEmbedding", "RagTrace", "Retrieval", "Timings"]
