"""Tests for sampler/__init__.py: the public surface is exactly `__all__`."""

from __future__ import annotations

import types

import sampler


def test_all_lists_every_public_name_and_nothing_else() -> None:
    public = {
        name
        for name, value in vars(sampler).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert set(sampler.__all__) == public
    assert len(sampler.__all__) == len(set(sampler.__all__))
