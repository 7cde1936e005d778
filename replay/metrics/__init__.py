"""Per-request records, switch classification, HDR histograms, results files."""

from replay.metrics.hist import ClassStats, Summary
from replay.metrics.record import RequestRecord, Usage
from replay.metrics.results import ResultsWriter, RunResults, merged_summary, read_results, request_line
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
    "Usage",
    "merged_summary",
    "read_results",
    "request_line",
]
