"""Recording live agent traffic into traces and anonymising them.

`replay record` runs `RecordingServer` (proxy.py relays, recorder.py writes, sessions.py infers
conversations, live.py shows them); `replay anonymize` is `run_anonymize`. Other tools' files
(`replay import`, `replay export`) are `replay.importers`, which reads `tokens` and `wire` here.
"""

from replay.record.anonymize import Anonymizer, anonymize_trace, run_anonymize
from replay.record.serve import RecordingServer, record
from replay.record.sessions import SessionInference

__all__ = [
    "Anonymizer",
    "RecordingServer",
    "SessionInference",
    "anonymize_trace",
    "record",
    "run_anonymize",
]
