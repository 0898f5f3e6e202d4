"""Loads the grader's pytest plugin for every test run in this repository."""

pytest_plugins = ["grader.pytest_plugin"]
