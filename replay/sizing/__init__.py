"""Disk-KV sizing over a trace: what a budget must hold (`chain`, the budget rule) and what a workload
does at each budget (`sweep_trace`), walking the simulator's own rules (`replay.sim.model`).

Modules, lowest first: `chain` (one cold read's files), `jobs` (trace -> the model's jobs), `rows`
(what a sweep reports), `lanes` (the sequential walk of every budget at once), `parallel` (budgets
split over worker processes), `sweep` (both plans, over jobs or a trace file), `output` (tables,
JSON), `options` (command-line strings).
"""

from __future__ import annotations

from replay.sizing.chain import Chain, ChainFile, budget_rule, chain
from replay.sizing.jobs import HISTORIES, SweepRequest, jobs_from_requests, jobs_from_trace, read_requests
from replay.sizing.options import parse_budgets, parse_slots, parse_token_list, size_config
from replay.sizing.output import chain_json, chain_table, human_bytes, sweep_json, sweep_table
from replay.sizing.parallel import auto_workers
from replay.sizing.rows import StaleFile, SweepReport, SweepRow, stale_files
from replay.sizing.sweep import PLANS, sweep, sweep_trace

__all__ = [
    "HISTORIES",
    "PLANS",
    "Chain",
    "ChainFile",
    "StaleFile",
    "SweepReport",
    "SweepRequest",
    "SweepRow",
    "auto_workers",
    "budget_rule",
    "chain",
    "chain_json",
    "chain_table",
    "human_bytes",
    "jobs_from_requests",
    "jobs_from_trace",
    "parse_budgets",
    "parse_slots",
    "parse_token_list",
    "read_requests",
    "size_config",
    "stale_files",
    "sweep",
    "sweep_json",
    "sweep_table",
    "sweep_trace",
]
