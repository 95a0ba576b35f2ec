"""Baselines that are not exact (async's staleness rules, ShadowSync), behind the engine's hook interface."""
