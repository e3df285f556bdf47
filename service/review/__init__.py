"""The human review queue: what enters it, the page reviewers work in, and what their labels teach.

Owns: the queue's records (`records.py`), its tables (`tables.py`) and store (`store.py`), intake
after judging (`intake.py`), the page and its JSON API (`page.py`; what an item shows: `item_view.py`;
`templates/`, `static/`), reviewer sign-in (`session.py`), judge calibration from reviewers' labels
(`calibration.py`), queue gauges (`gauges.py`), the faithfulness estimates corrected by the blind
labels and judge-human agreement per app (`correction.py`, reading `blind_labels.py`, testing with
`agreement.py`), the blind-label plan `ragmon review labels` (`label_plan.py`) and the export of
reviewed items as golden-set rows (`export.py`).

May import: `probes` (golden-set rows), `judge`, `ingest.auth`, `store`, `metrics`, `config`, `model`,
`errors`. To change the review page, touch `page.py`, `item_view.py`, `templates/` and `static/`.
"""
