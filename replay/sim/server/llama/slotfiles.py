"""Slot files in `--slot-save-path`: what a save writes and a restore reads back, across restarts.

The model's slot file (`context.SlotFile`: tokens, state, checkpoints, modelled size) is written as
one small JSON document; its modelled size, not the bytes on disk, is what the API reports (a
35B model's 0.68 GiB file is a few hundred KB here).
"""

from __future__ import annotations

import os
from pathlib import Path

import orjson

from replay.sim.model.llama.checkpoints import Checkpoint
from replay.sim.model.llama.context import SlotFile
from replay.sim.model.llama.memory import MemState
from replay.sim.model.llama.prompt import ChatTokenizer
from replay.sim.model.seq import TokenSeq

FORMAT = "replay-sim-llama-slot/1"


class SlotFiles:
    def __init__(self, directory: str, tok: ChatTokenizer) -> None:
        self.dir = Path(directory)
        self.tok = tok

    def write(self, name: str, file: SlotFile) -> None:
        doc = {
            "format": FORMAT,
            "tokens": file.tokens.tokens(),
            "state": {"n": file.state.n, "swa": list(file.state.swa), "rec_pos": file.state.rec_pos},
            "checkpoints": [
                {
                    "n_tokens": c.n_tokens,
                    "pos_min": c.pos_min,
                    "pos_max": c.pos_max,
                    "size": c.size,
                    "swa": list(c.swa),
                }
                for c in file.checkpoints
            ],
            "bytes": file.bytes,
            "state_end": file.state_end,
        }
        path = self.dir / name
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(orjson.dumps(doc))
        os.replace(tmp, path)

    def read(self, name: str, streams: int) -> SlotFile | None:
        """The file, or None when it is missing or not one of ours (llama-server: "invalid slot
        save file")."""
        try:
            doc = orjson.loads((self.dir / name).read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            return None
        try:
            state = doc["state"]
            ckpts = tuple(
                Checkpoint(c["n_tokens"], c["pos_min"], c["pos_max"], c["size"], -1, tuple(c["swa"]))
                for c in doc["checkpoints"]
            )
            tokens = TokenSeq((tuple(str(t) for t in doc["tokens"]),))
            return SlotFile(
                tokens,
                MemState(state["n"], tuple(state["swa"]), state["rec_pos"]),
                ckpts,
                doc["bytes"],
                doc["state_end"],
            )
        except (KeyError, TypeError, ValueError):
            return None
