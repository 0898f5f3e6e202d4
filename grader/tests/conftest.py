"""Fixture tasks (fixtures/<kind>/) are graded by the tests in this folder, never collected as tests themselves."""

collect_ignore_glob = ["fixtures/*"]
