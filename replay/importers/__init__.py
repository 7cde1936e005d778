"""Other tools' files as traces: `replay import FORMAT SRC OUT` and `replay export FORMAT SRC OUT`.

Modules: `base` (what every importer shares: options, the request model, time-ordered merging,
streaming, writing), `registry` (the formats by name, `run_import`/`run_export`: validate, then
rename into place), and one module per source: the agents' own stores (`claude_code`, `codex`,
`hermes`, `opencode`) and the public corpora (`mooncake`, `sharegpt`, `weka`, `otel`, `swe`, `tracelab`).
Each says what its format loses (traces/IMPORTERS.md). Importers read token counts and the wire
shapes from `replay.record` (`tokens`, `wire`); nothing in `record` imports them.
"""
