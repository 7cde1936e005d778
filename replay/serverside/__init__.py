"""What the server says about a run in its own words: its log and its `/metrics` counters.

Modules: `logs` (the log beside a run: which parser, the settings in force, `server` records per
request, `records_beside` for results that carry none), one correlator per log format: `ds4`
(ds4-server and the simulator) and `llamacpp` (llama-server by task, its host prompt cache replayed
by `llamacpp_host_cache`), `routerlog` (which worker SGLang's router sent each request to), and
`metrics` (Prometheus counters against the records' usage, memory gauges). Numbers and closed-vocabulary names only, never text from a log. The parsers are
`drivers.logs`; `runs` calls this package, and nothing here runs a replay.
"""
