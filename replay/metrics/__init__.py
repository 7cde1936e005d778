"""Per-request records, switch classification, HDR histograms, results files."""

from replay.metrics.hist import ClassStats, Summary
from replay.metrics.record import RequestRecord
from replay.metrics.results import ResultsWriter, RunResults, merged_summary, read_results
from replay.metrics.switch import CLASSES, Switch, SwitchTracker

__all__ = [
    "CLASSES",
    "ClassStats",
    "RequestRecord",
    "ResultsWriter",
    "RunResults",
    "Summary",
    "Switch",
    "SwitchTracker",
    "merged_summary",
    "read_results",
]
