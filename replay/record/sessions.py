"""Which conversation a recorded request belongs to, and what kind of request it is.

Agents rarely say. The rules, in order:
1. An explicit label names the session: a `/s/NAME/` path prefix or an `X-Replay-Session` header.
   Anthropic `metadata.user_id` is weaker: Claude Code sends one id for a main conversation, its
   sub-agents and its title requests alike, so it only scopes the inference below (sessions
   are inferred among requests carrying the same id).
2. Continuation: the session with a recent request whose messages are a prefix of this one's;
   the longest prefix wins. Every message is hashed once and prefixes are chained hashes, so
   this costs one dictionary lookup per message, whatever the number of sessions.
   If the session has a request in flight the new one is a `concurrent` turn (the skill-review
   case). If the prefix is an older request and this one has fewer messages than the session's
   latest, the history was cut (an edit, a redo): the prefix was rewritten, tagged `compaction`.
3. Compaction: no prefix matches, but a session starts with the same system prompt and tools, is
   longer than this request, and either its last reply text appears in this request (the summary
   an agent carries over) or this request arrives in that session's rhythm (idle, and the gap
   since its last reply is within a few times its usual gap). A cron-like arrival time (the first
   seconds of a wall-clock minute) defeats the rhythm rule: that is a cron job starting.
   Both are index lookups, not a scan of the sessions: replies by their first characters (looked
   up at every word boundary of the request's texts; a reply glued to the end of a word is not
   found), sessions by system prompt in order of their last reply, scanned only as far back as
   the longest rhythm any of them keeps.
4. Otherwise a new session.

A session's role is `cron` when labelled so (header `X-Replay-Role`, or a label containing
`cron`) or first seen at a cron-like time; `review`/`subagent` when labelled so; else
`interactive`.

A recorder runs for days: a session keeps heads for rewinds only `rewind_s` back (and at most
`max_heads`), a session idle for `idle_after_s` keeps only what a resumption needs (its latest
request's prefix hash and its reply's key), and no text of any reply is held at all.
"""

from __future__ import annotations

import hashlib
import re
import statistics
import time
from array import array
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from replay.trace.keys import frozen, message_key, prefix_chain
from replay.trace.model import Message

LABEL_ROLES = ("cron", "review", "subagent", "background")
_LABEL_OK = re.compile(r"[^A-Za-z0-9_.:-]+")
_CC_SESSION = re.compile(r"_session_([0-9a-fA-F-]{8,})")
_WORD_EDGES = re.compile(r"(?<!\w)|\b")  # where a carried-over reply may start
_MAX_GAPS = 16

# A completed reply as the compaction rule looks for it: hashes of its first characters and of
# the whole, and its length (no text).
ReplyKey = tuple[int, int, int]


def clean_label(name: str) -> str:
    return _LABEL_OK.sub("-", name).strip("-")[:64] or "session"


def user_id_scope(user_id: str) -> str:
    """A short, non-identifying name for an Anthropic user id (its session part for Claude Code)."""
    try:
        obj = orjson.loads(user_id)
    except orjson.JSONDecodeError:
        obj = None
    if isinstance(obj, dict) and isinstance(obj.get("session_id"), str):
        return "u-" + clean_label(obj["session_id"])[:8]
    match = _CC_SESSION.search(user_id)
    if match:
        return "u-" + match.group(1)[:8]
    return "u-" + hashlib.blake2b(user_id.encode(), digest_size=4).hexdigest()


@dataclass(slots=True, frozen=True)
class Label:
    name: str
    source: str  # "path" | "header" | "user_id"

    @property
    def explicit(self) -> bool:
        return self.source != "user_id"


@dataclass(slots=True, eq=False)
class Head:
    """One request, as a possible prefix of later ones: its messages' chained hash, not the messages
    (a recorder that runs for days must not hold every conversation it saw)."""

    session: RecordedSession
    n: int  # messages
    chain: int
    arrived_ns: int
    tag: str = "turn"
    done_ns: int | None = None
    rid: int | None = None  # trace id, once written
    status: str = ""
    prompt_tokens: int | None = None


@dataclass(slots=True, eq=False)
class RecordedSession:
    """Recording side: a conversation inferred among the requests the proxy records (its heads,
    rhythm and reply keys). `engine.session.ReplaySession` is the replay side's."""

    id: str
    role: str
    api: str
    model: str
    scope: str  # sessions are inferred among requests of one scope (API, and user id if any)
    explicit: bool
    system_key: int | None
    labels: dict[str, Any] = field(default_factory=dict)
    heads: list[Head] = field(default_factory=list)  # oldest first
    in_flight: int = 0
    requests: int = 0
    errors: int = 0
    last: Head | None = None  # latest arrival
    last_done: Head | None = None  # latest completion
    # The latest `_MAX_GAPS` gaps, unboxed: 8 bytes each, not a float object and a list slot (32).
    gaps: array[float] = field(default_factory=lambda: array("d"))
    order: int = 0  # creation order: ties between candidates go to the oldest session
    reply: ReplyKey | None = None  # of `last_done`'s reply, when long enough to be carried over
    window_s: float = 0.0  # how long after its last reply a request is still in its rhythm
    declared: str | None = None  # the name it was written under in the trace (the recorder's)

    @property
    def depth(self) -> int:
        """Messages in the session's latest request."""
        return self.last.n if self.last else 0


@dataclass(slots=True)
class Assignment:
    session: RecordedSession
    head: Head
    tag: str  # turn | concurrent | compaction
    base: Head | None  # the request whose messages this one extends (for delta encoding)
    after: Head | None  # the completed request this one waited for
    delay_s: float | None
    new_session: bool


def _system_key(messages: list[Message], tools: int | None) -> int | None:
    n = 0
    while n < len(messages) and messages[n].get("role") == "system":
        n += 1
    if n == 0 and tools is None:
        return None
    return hash((tuple(message_key(m) for m in messages[:n]), tools))


def tools_key(tools: Any) -> int | None:
    return hash(frozen(tools)) if tools else None


def _texts(messages: list[Message]) -> list[str]:
    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, str):
            out.append(content)
        elif isinstance(content, list):
            out.extend(p for p in content if isinstance(p, str))
    return out


class SessionInference:
    """Assigns each arriving request to a session; told when each one completes."""

    def __init__(
        self,
        wall_clock: Callable[[], float] = time.time,
        rhythm_factor: float = 4.0,
        rhythm_floor_s: float = 60.0,
        cron_window_s: float = 2.0,
        max_heads: int = 16,
        carry_over_chars: int = 40,
        idle_after_s: float = 1800.0,
        rewind_s: float = 600.0,
    ) -> None:
        self.wall_clock = wall_clock
        self.rhythm_factor = rhythm_factor
        self.rhythm_floor_s = rhythm_floor_s
        self.cron_window_s = cron_window_s
        self.max_heads = max_heads
        self.carry_over_chars = carry_over_chars
        self.idle_after_s = idle_after_s
        self.rewind_s = rewind_s
        self.on_idle: Callable[[RecordedSession], None] | None = None  # told when a session is trimmed
        self.sessions: dict[str, RecordedSession] = {}
        self._index: dict[tuple[str, int], Head] = {}  # (scope, chain) -> latest head
        self._scope_count: dict[str, int] = {}
        # scope -> hash of a reply's first `carry_over_chars` characters -> session -> (length, hash)
        self._replies: dict[str, dict[int, dict[RecordedSession, tuple[int, int]]]] = {}
        # (scope, system key) -> its inferred sessions, in order of their latest reply. This and
        # `_recent` are kept in order by `move_to_end`, not by deleting and inserting again: a
        # dict's deletions leave holes that make it resize to three times its live entries (a
        # 100,000-session table doubles after every session has come back once).
        self._by_system: dict[tuple[str, int], OrderedDict[RecordedSession, None]] = {}
        self._longest_window: dict[tuple[str, int], float] = {}  # never shrinks
        self._recent: OrderedDict[RecordedSession, int] = OrderedDict()  # -> last activity (ns), oldest first

    # --- arrival -----------------------------------------------------------------------

    def arrive(
        self,
        messages: list[Message],
        api: str,
        model: str,
        now_ns: int,
        tools: Any = None,
        label: Label | None = None,
        role_hint: str | None = None,
    ) -> Assignment:
        self._release_idle(now_ns)
        chain = prefix_chain(messages)
        skey = _system_key(messages, tools_key(tools))
        # A conversation keeps one API: the same messages sent over another API are another session.
        scope = f"{api}|{label.name if label is not None and not label.explicit else ''}"
        if label is not None and label.explicit:
            sid = clean_label(label.name)
            if sid in self.sessions and not self.sessions[sid].explicit:
                sid += "-labelled"  # an inferred session already has this name
            scope = "label:" + sid
            session = self.sessions.get(sid)
            new = session is None
            if session is None:
                session = self._new_session(sid, api, model, scope, True, skey, label, role_hint)
            base = self._longest(chain, scope)
            tag = self._tag(session, base, len(messages), new)
        else:
            base = self._longest(chain, scope)
            new = False
            if base is not None:
                session = base.session
                tag = self._tag(session, base, len(messages), False)
            else:
                session = self._compacted(messages, skey, scope, now_ns)
                if session is not None:
                    tag = "compaction"
                else:
                    new = True
                    sid = self._next_id(scope)
                    session = self._new_session(sid, api, model, scope, False, skey, label, role_hint)
                    tag = "turn"
        if tag == "compaction" and base is None:
            base = session.last
        after = base if base is not None and base.done_ns is not None and base.rid is not None else None
        if after is None and session.last_done is not None and session.last_done.rid is not None:
            after = session.last_done
        delay = (
            max(0.0, (now_ns - after.done_ns) / 1e9)
            if after is not None and after.done_ns is not None
            else None
        )
        if delay is not None:
            session.gaps.append(delay)
            if len(session.gaps) > _MAX_GAPS:
                del session.gaps[0]
        head = Head(session=session, n=len(messages), chain=chain[-1], arrived_ns=now_ns, tag=tag)
        self._add_head(session, head)
        self._touch(session, now_ns)
        session.in_flight += 1
        session.requests += 1
        session.last = head
        return Assignment(session, head, tag, base, after, delay, new)

    def _tag(self, session: RecordedSession, base: Head | None, n: int, new: bool) -> str:
        """concurrent if the session has a request in flight; compaction if the history was cut
        (no prefix at all, or an older request's prefix with fewer messages than the latest)."""
        if session.in_flight:
            return "concurrent"
        if new or session.last is None:
            return "turn"
        if base is None or (base is not session.last and n < session.depth):
            return "compaction"
        return "turn"

    def _longest(self, chain: list[int], scope: str) -> Head | None:
        for i in range(len(chain) - 1, 0, -1):
            head = self._index.get((scope, chain[i]))
            if head is not None:
                return head
        return None

    def _compacted(
        self, messages: list[Message], skey: int | None, scope: str, now_ns: int
    ) -> RecordedSession | None:
        carried = self._carried(messages, scope)
        if carried:
            return max(carried, key=_latest_first)
        if skey is None or self.cron_like():
            return None
        return self._rhythmic(len(messages), (scope, skey), now_ns)

    def _carried(self, messages: list[Message], scope: str) -> list[RecordedSession]:
        """Sessions whose last reply appears whole in one of the request's texts."""
        replies = self._replies.get(scope)
        if not replies:
            return []
        k = self.carry_over_chars
        found = []
        for t in _texts(messages):
            if len(t) < k:
                continue
            for m in _WORD_EDGES.finditer(t, 0, len(t) - k + 1):
                i = m.start()
                hits = replies.get(hash(t[i : i + k]))
                if hits:
                    found.extend(
                        s for s, (n, h) in hits.items() if s not in found and hash(t[i : i + n]) == h
                    )
        return found

    def _rhythmic(self, n: int, group: tuple[str, int], now_ns: int) -> RecordedSession | None:
        """The session of this system prompt, longer than `n` messages, that last replied within
        its rhythm (sessions are walked latest reply first, only as far as any rhythm reaches)."""
        sessions = self._by_system.get(group)
        if not sessions:
            return None
        reach = self._longest_window.get(group, 0.0)
        picked = []
        for s in reversed(sessions):
            done = s.last_done
            if done is None or done.done_ns is None:
                continue
            gap = (now_ns - done.done_ns) / 1e9
            if gap > reach:
                break
            if not s.in_flight and s.depth > n and gap <= s.window_s:
                picked.append(s)
        return max(picked, key=_latest_first) if picked else None

    def _in_rhythm(self, s: RecordedSession, now_ns: int) -> bool:
        if s.in_flight or s.last_done is None or s.last_done.done_ns is None:
            return False
        return (now_ns - s.last_done.done_ns) / 1e9 <= s.window_s

    def recent(self, n: int) -> list[RecordedSession]:
        """The `n` sessions active last (an arrival or a reply), latest first; idle ones are not
        among them. Safe from another thread: the keys are copied in one step."""
        return list(self._recent)[-n:][::-1]

    def _touch(self, session: RecordedSession, now_ns: int) -> None:
        recent = self._recent
        if session in recent:
            recent.move_to_end(session)
        recent[session] = now_ns

    def _release_idle(self, now_ns: int) -> None:
        """Sessions idle for `idle_after_s` keep only the heads a resumption extends."""
        horizon = now_ns - int(self.idle_after_s * 1e9)
        recent = self._recent
        while recent:
            session, last = next(iter(recent.items()))
            if last > horizon:
                return
            del recent[session]
            if session.in_flight:
                continue
            keep = [h for h in session.heads if h is session.last or h is session.last_done]
            for old in session.heads:
                if old not in keep and self._index.get((session.scope, old.chain)) is old:
                    del self._index[(session.scope, old.chain)]
            session.heads = keep
            if self.on_idle is not None:
                self.on_idle(session)

    def cron_like(self) -> bool:
        """The first seconds of a wall-clock minute: when cron starts jobs."""
        return (self.wall_clock() % 60.0) < self.cron_window_s

    def _next_id(self, scope: str) -> str:
        name = scope.partition("|")[2]
        while True:
            n = self._scope_count.get(name, 0) + 1
            self._scope_count[name] = n
            sid = f"s{n}" if not name else name if n == 1 else f"{name}-{n}"
            if sid not in self.sessions:  # a label may have taken it
                return sid

    def _new_session(
        self,
        sid: str,
        api: str,
        model: str,
        scope: str,
        explicit: bool,
        skey: int | None,
        label: Label | None,
        role_hint: str | None,
    ) -> RecordedSession:
        role = "interactive"
        if role_hint:
            role = clean_label(role_hint).lower()
        elif label is not None and label.explicit:
            role = next((r for r in LABEL_ROLES if r in label.name.lower()), "interactive")
        if role == "interactive" and self.cron_like():
            role = "cron"
        labels: dict[str, Any] = {}
        if label is not None:
            labels["label_source"] = label.source
        session = RecordedSession(
            order=len(self.sessions),
            id=sid,
            role=role,
            api=api,
            model=model,
            scope=scope,
            explicit=explicit,
            system_key=skey,
            labels=labels,
        )
        self.sessions[sid] = session
        return session

    def _add_head(self, session: RecordedSession, head: Head) -> None:
        """Index the new request and trim the session's older heads."""
        session.heads.append(head)
        self._index[(session.scope, head.chain)] = head
        self._trim(session, head.arrived_ns)

    def _trim(self, session: RecordedSession, now_ns: int) -> None:
        """Let go of heads beyond `max_heads`, and of heads older than `rewind_s` that no request
        in flight or latest reply needs: a conversation that comes back every few minutes must not
        hold one head per turn it ever took (a rewind further back is still tagged by the
        compaction rules). Run at each arrival and each completion: a session waiting for its next
        turn holds its latest head only, not also the one before it until that turn comes."""
        heads = session.heads
        horizon = now_ns - int(self.rewind_s * 1e9)
        while len(heads) > 1 and (
            len(heads) > self.max_heads
            or (
                heads[0].arrived_ns < horizon
                and heads[0].done_ns is not None
                and heads[0] is not session.last
                and heads[0] is not session.last_done
            )
        ):
            old = heads.pop(0)
            if self._index.get((session.scope, old.chain)) is old:
                del self._index[(session.scope, old.chain)]

    def withdraw(self, assignment: Assignment) -> None:
        """Undo an arrival (the upstream refused the request): it is no prefix, no session's
        latest request, and a session it alone started is gone."""
        head, session = assignment.head, assignment.session
        session.in_flight -= 1
        session.requests -= 1
        if head in session.heads:
            session.heads.remove(head)
        if self._index.get((session.scope, head.chain)) is head:
            del self._index[(session.scope, head.chain)]
            for older in reversed(session.heads):  # an earlier request with the same messages
                if older.chain == head.chain:
                    self._index[(session.scope, head.chain)] = older
                    break
        if session.last is head:
            session.last = session.heads[-1] if session.heads else None
        if assignment.delay_s is not None and session.gaps and session.gaps[-1] == assignment.delay_s:
            session.gaps.pop()
        if assignment.new_session and session.requests == 0 and session.in_flight == 0:
            self.sessions.pop(session.id, None)

    # --- completion --------------------------------------------------------------------

    def done(
        self,
        assignment: Assignment,
        now_ns: int,
        rid: int | None,
        reply: Message | None,
        status: str,
        prompt_tokens: int | None = None,
    ) -> None:
        head = assignment.head
        session = assignment.session
        head.done_ns = now_ns
        head.rid = rid
        head.status = status
        head.prompt_tokens = prompt_tokens
        session.in_flight -= 1
        if status != "ok":
            session.errors += 1
        if session.last_done is None or (session.last_done.done_ns or 0) <= now_ns:
            content = (reply or {}).get("content")
            session.last_done = head
            if not session.explicit:
                self._index_reply(session, content if isinstance(content, str) else "")
        self._trim(session, now_ns)
        self._rewindow(session)
        self._touch(session, now_ns)

    def _index_reply(self, session: RecordedSession, text: str) -> None:
        """File the session under its new last reply (for carry-over) and its system prompt's
        latest replies (for rhythm); only a key of the reply is kept, never its text."""
        replies = self._replies.setdefault(session.scope, {})
        if session.reply is not None:
            anchor = session.reply[0]
            bucket = replies.get(anchor)
            if bucket is not None:
                bucket.pop(session, None)
                if not bucket:
                    del replies[anchor]
            session.reply = None
        if len(text) >= self.carry_over_chars:
            anchor = hash(text[: self.carry_over_chars])
            session.reply = (anchor, len(text), hash(text))
            replies.setdefault(anchor, {})[session] = (len(text), hash(text))
        if session.system_key is not None:
            latest = self._by_system.setdefault((session.scope, session.system_key), OrderedDict())
            if session in latest:
                latest.move_to_end(session)
            else:
                latest[session] = None

    def _rewindow(self, session: RecordedSession) -> None:
        gaps = session.gaps
        usual = statistics.median(gaps) if gaps else 0.0
        session.window_s = max(self.rhythm_floor_s, self.rhythm_factor * usual)
        if session.system_key is not None and not session.explicit:
            group = (session.scope, session.system_key)
            if session.window_s > self._longest_window.get(group, 0.0):
                self._longest_window[group] = session.window_s


def _latest_first(s: RecordedSession) -> tuple[int, int]:
    """The most recent last reply wins; on a tie, the oldest session (as a scan in order would)."""
    done = s.last_done
    return (done.done_ns or 0 if done is not None else 0, -s.order)
