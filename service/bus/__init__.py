"""Where finished traces and feedback travel between assembly and the sinks.

Owns: the in-process bus (`memory.py`), the Kafka bus and receiver (`kafka.py`), consumer lag from the
fetch high watermark (`lag.py`), and the single-active-scheduler lock (`leader.py`).

May import: `consumer`, `metrics`, `config`, `model`, `errors`, `lifecycle`. kafka-python errors are
caught only here.
"""
