"""The weekly drift and quality report, as HTML with inline charts and as Markdown.

Owns: building the report (`weekly.py`) and writing it out (`render.py`), its faithfulness
section, judge-only and human-corrected, with agreement and the label plan (`faithfulness.py`), its
SVG charts (`svg_chart.py`), where the latest report is kept (`latest.py`, served by `service/api/reports.py`)
and the `ragmon report` command (`cli.py`).

May import: `review`, `drift`, `judge`, `store`, `metrics`, `config`, `model`.
"""
