"""Where finished traces and feedback travel between assembly and the sinks.

Owns: the in-process bus (`memory.py`), the Kafka bus (`kafka_bus.py`: ingest's producer) and receiver
(`kafka.py`), the settings every Kafka client shares (`kafka_client.py`), which offsets of the
spans topic a sinks worker may commit (`span_offsets.py`), consumer lag from the fetch high watermark
(`lag.py`), the group's backlog and the broker's reachability measured from the broker (`backlog.py`),
and the single-active-scheduler lock (`leader.py`).

May import: `consumer`, `metrics`, `conventions`, `config`, `model`, `errors`, `lifecycle`. kafka-python
errors are caught only here.
"""
