"""The weekly drift and quality report, as HTML with inline charts and as Markdown.

Owns: building and rendering the report (`weekly.py`), its SVG charts (`svg_chart.py`), where the
latest report is kept (`latest.py`, served by `service/api/reports.py`) and the `ragmon report`
command (`cli.py`).

May import: `drift`, `judge`, `store`, `metrics`, `config`, `model`.
"""
