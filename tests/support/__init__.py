"""Helpers the tests import as `tests.support.NAME` (servers, fixtures, strategies, log writers)."""
