"""Use cases: each wires pure planning to the effects it needs."""
