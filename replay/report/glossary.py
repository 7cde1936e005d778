"""The words a report uses, defined once: the page's glossary, its table tooltips and the plots'
legend tooltips all read from here, so a term never means two things on one page."""

from __future__ import annotations

GLOSSARY = (
    (
        "switch",
        "A request whose conversation is not the one the server handled just before it: the server "
        "must resume that conversation from live KV, restore it from a disk checkpoint, or re-read it.",
    ),
    ("continue", "A request that extends the conversation the server handled just before it."),
    ("cold", "The first request of a conversation: nothing of it can be cached but a shared prefix."),
    (
        "compaction",
        "A request that keeps only part of its conversation's earlier messages (the agent "
        "summarised them): its prompt changes in the middle, so it is re-read from there.",
    ),
    ("concurrent", "A request sent while another of the run was still in flight."),
    (
        "live miss",
        "The server's log says the request's conversation was not the one in its live KV slot. "
        "Every switch on a one-slot server is a live miss; a continue can be one too, when the server's "
        "reply does not match what the client sends back, which is why live misses can outnumber switches.",
    ),
    ("restore", "A disk checkpoint loaded instead of re-reading those tokens."),
    (
        "store reasons",
        "Why the server wrote a checkpoint: cold (the first prompt of a conversation), "
        "continued (every N tokens of a long prefill), evict (the live conversation, saved before another "
        "takes its slot), shutdown.",
    ),
    (
        "eviction",
        "A checkpoint deleted to stay within the disk budget; 0 hits means it had never been restored.",
    ),
    ("re-processed", "Prompt tokens the server had to compute (prefill) for this request."),
    ("cached", "Prompt tokens the server took from live KV or a disk checkpoint instead."),
    (
        "modelled",
        "Seconds the real server would take, as the simulator models them (it runs faster than that).",
    ),
    ("measured", "Wall-clock seconds measured on this machine by the client."),
)
TERMS = dict(GLOSSARY)

# Legend entries of the plots -> what they mean (shown as SVG <title> tooltips).
LEGEND = {
    "queued": "waiting for the server: another request held the slot",
    "evict save + restore": "disk work before the prefill: saving the slot's conversation, loading a checkpoint",
    "prefill": TERMS["re-processed"],
    "decode": "generating the reply",
    "switch": TERMS["switch"],
    "compaction": TERMS["compaction"],
    "cold": TERMS["cold"],
    "disk KV in use (GiB)": "the size of every checkpoint on disk after each store or eviction",
    "budget": "the server's disk budget (--kv-disk-space-mb)",
    "restore": TERMS["restore"],
    "evicted, 0 hits": TERMS["eviction"],
    "evicted, had hits": "a checkpoint deleted to stay within the budget after it had been restored at least once",
    "host-cache memory in use (--cache-ram) (MiB)": (
        "llama-server's prompt cache in host RAM: each saved prompt adds its state and checkpoints, each "
        "prompt loaded back or evicted leaves it"
    ),
    "limit": "the host cache's size limit (--cache-ram)",
    "evicted": "a prompt the host cache dropped to stay within its limit, or one a longer saved prompt contains",
}
