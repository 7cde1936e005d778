"""Recording live agent traffic into traces, anonymising them, and converting other formats.

`replay record` runs `RecordingServer` (proxy.py relays, recorder.py writes, sessions.py infers
conversations, live.py shows them); `replay anonymize` is `run_anonymize`; `replay import` and
`replay export` go through the registries in importers.py.
"""

from replay.record.anonymize import Anonymizer, anonymize_trace, run_anonymize
from replay.record.importers import EXPORTERS, IMPORTERS, run_export, run_import
from replay.record.serve import RecordingServer, record
from replay.record.sessions import SessionInference

__all__ = [
    "EXPORTERS",
    "IMPORTERS",
    "Anonymizer",
    "RecordingServer",
    "SessionInference",
    "anonymize_trace",
    "record",
    "run_anonymize",
    "run_export",
    "run_import",
]
