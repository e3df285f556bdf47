"""One drift check on two samples (`service.drift.checks`): the query-text test's explanation."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np

from service.drift.checks import CheckSettings, TextReference, check_samples
from service.drift.sample import Observation, Sample

T0 = datetime(2024, 1, 1, tzinfo=UTC)
OLD = [
    ["card", "declined", "blocked", "pin", "contactless", "expired"],
    ["transfer", "iban", "beneficiary", "pending", "sepa", "wire"],
    ["password", "login", "email", "profile", "address", "verify"],
]
TRAVEL = ["visa", "passport", "flight", "hotel", "luggage", "embassy"]


def _sample(rng: np.random.Generator, n: int, start: datetime, new_every: int = 0) -> Sample:
    observations = []
    for i in range(n):
        words = TRAVEL if new_every and i % new_every == 0 else OLD[int(rng.integers(3))]
        query = "how do i " + " ".join(rng.choice(words, 3, replace=False)) + f" {int(rng.integers(50))}"
        # Every vector alike: an explanation drawn from them could not tell any queries apart.
        observations.append(
            Observation(f"t{start:%H}{i}", start, query=query, vector=np.ones(8, dtype=np.float32))
        )
    return Sample(tuple(observations))


def test_a_drifted_text_test_is_explained_in_its_own_tfidf_space() -> None:
    rng = np.random.default_rng(0)
    reference = _sample(rng, 800, T0)
    current = _sample(rng, 500, T0 + timedelta(hours=2), new_every=10)
    checks = check_samples(
        reference,
        current,
        reference_id="ref",
        reference_range=(T0, T0 + timedelta(hours=1)),
        window=(T0 + timedelta(hours=2), T0 + timedelta(hours=3)),
        settings=CheckSettings(min_window=50),
        text=TextReference(embedder_state=None),
    )
    query = next(c for c in checks if c.result.detector == "query_text_knn")
    assert query.result.drifted and query.explanation
    top = query.explanation[0]
    assert top["significant"] and top["share_reference"] == 0.0
    assert all(example.split()[3] in TRAVEL for example in top["examples"])
    assert set(top["terms"]) <= set(TRAVEL)
    # The new topic may come as one group or a few; together its groups hold (nearly) all 50 travel queries.
    travel = [
        g
        for g in query.explanation
        if g["significant"] and all(e.split()[3] in TRAVEL for e in g["examples"])
    ]
    assert 45 <= sum(g["n_window"] for g in travel) <= 50
