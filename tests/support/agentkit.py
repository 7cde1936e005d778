"""The agents people run, installed into a cache folder and driven headless against the simulator.

Each `Agent` says how to install it (npm or PyPI, pinned version), how to point it at a local
endpoint with its non-essential traffic off (the files in `examples/agents/`, with `{BASE}` and
`{MODEL}` filled in), and the two prompts of its task (the second continues the first session).
Every run happens in a folder of its own (HOME, XDG folders, project), so the agent's own files
land where the test reads them, and with HTTP(S)_PROXY set to a refusing proxy on 127.0.0.1 that
notes where it was asked to go: model traffic reaches the recorder on loopback, anything else is
refused and named.
"""

from __future__ import annotations

import json
import os
import shutil
import socketserver
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "agents"
MODEL = "sim-model"
TASK = "Read README.md and say in one line what it is about."
FOLLOW_UP = "Now list the files next to it and summarise."


def cache_dir() -> Path:
    """Where `just agents` installs them: REPLAY_AGENTS_DIR, else ~/.cache/agent-replay/agents."""
    env = os.environ.get("REPLAY_AGENTS_DIR")
    return Path(env) if env else Path.home() / ".cache" / "agent-replay" / "agents"


@dataclass(frozen=True)
class Agent:
    name: str
    source: str  # "npm" | "pypi"
    package: str
    version: str
    binary: str  # the command's name in the installed bin folder
    tools: tuple[str, ...]  # read-only tools the simulator may call (names as the agent offers them)
    api: str  # the trace API its model calls use
    routes: tuple[str, ...]  # the paths of its model calls
    # Hosts it still asks for with every switch off (the proxy refuses them; it works without).
    unswitchable: tuple[str, ...] = ()

    def bin_path(self, cache: Path | None = None) -> Path:
        cache = cache or cache_dir()
        if self.source == "npm":
            return cache / "npm" / "node_modules" / ".bin" / self.binary
        return cache / self.name / "bin" / self.binary


AGENTS: dict[str, Agent] = {
    a.name: a
    for a in (
        Agent(
            "claude-code",
            "npm",
            "@anthropic-ai/claude-code",
            "2.1.197",
            "claude",
            ("Read", "Glob", "Grep", "LS"),
            "anthropic",
            ("/v1/messages",),
        ),
        Agent(
            "codex",
            "npm",
            "@openai/codex",
            "0.171.0",
            "codex",
            ("exec_command", "shell", "shell_command"),
            "openai-responses",
            ("/v1/responses",),
        ),
        Agent(
            "opencode",
            "npm",
            "opencode-ai",
            "1.18.33",
            "opencode",
            ("read", "glob", "grep", "list"),
            "openai",
            ("/v1/chat/completions",),
            # It looks up @opencode-ai/plugin and @opentui/core to install them into its config
            # folder; no switch stops that. (It also fetches ripgrep from github.com unless `rg`
            # is on PATH: Debian's ripgrep package.)
            ("registry.npmjs.org:443",),
        ),
        Agent(
            "hermes",
            "pypi",
            "hermes-agent",
            "0.19.0",
            "hermes",
            ("read_file", "search_files"),
            "openai",
            ("/v1/chat/completions",),
        ),
    )
}


def installed(agent: Agent) -> bool:
    return agent.bin_path().exists()


def install(names: list[str], say: Callable[[str], None] = print) -> dict[str, float]:
    """Install the named agents (pinned versions) into the cache folder; seconds each took.

    npm packages share one folder (one `npm install`), Hermes gets a venv of its own. An agent
    already there at its pinned version is not installed again.
    """
    cache = cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    took: dict[str, float] = {}
    npm = [AGENTS[n] for n in names if AGENTS[n].source == "npm" and not _has_version(AGENTS[n])]
    if npm:
        if shutil.which("npm") is None:
            raise SystemExit("npm is not installed: the Node.js agents need it (Debian: apt-get install npm)")
        t = time.monotonic()
        specs = [f"{a.package}@{a.version}" for a in npm]
        say(f"npm install {' '.join(specs)} into {cache / 'npm'}")
        (cache / "npm").mkdir(exist_ok=True)
        subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", "--prefix", str(cache / "npm"), *specs], check=True
        )
        for a in npm:
            took[a.name] = time.monotonic() - t
    for a in (AGENTS[n] for n in names if AGENTS[n].source == "pypi"):
        if _has_version(a):
            continue
        t = time.monotonic()
        venv = cache / a.name
        say(f"pip install {a.package}=={a.version} into {venv}")
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", f"{a.package}=={a.version}"], check=True)
        took[a.name] = time.monotonic() - t
    return took


def _has_version(agent: Agent) -> bool:
    cache = cache_dir()
    if not agent.bin_path(cache).exists():
        return False
    if agent.source == "npm":
        meta = cache / "npm" / "node_modules" / agent.package / "package.json"
        return meta.exists() and f'"version": "{agent.version}"' in meta.read_text()
    dist = list(
        (cache / agent.name / "lib").glob(
            f"python3*/site-packages/{agent.package.replace('-', '_')}-*.dist-info"
        )
    )
    return any(d.name.endswith(f"-{agent.version}.dist-info") for d in dist)


# --- the refusing proxy -----------------------------------------------------------------


class _Refuse(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        line = self.rfile.readline(4096).decode("latin-1").strip()
        if line:
            self.server.asked.append(line)  # type: ignore[attr-defined]
        self.wfile.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")


class RefusingProxy(socketserver.ThreadingTCPServer):
    """An HTTP proxy on 127.0.0.1 that refuses everything and remembers each request line
    (`CONNECT host:443 HTTP/1.1`, `GET http://host/...`)."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Refuse)
        self.asked: list[str] = []
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def __enter__(self) -> RefusingProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
        self.server_close()

    def hosts(self) -> list[str]:
        return sorted({line.split()[1] for line in self.asked if len(line.split()) > 1})


# --- one agent's run ----------------------------------------------------------------------


@dataclass
class Run:
    """One agent's folders and environment for a task against `base` (the recorder)."""

    agent: Agent
    root: Path
    base: str
    proxy: str
    env: dict[str, str] = field(default_factory=dict)

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def project(self) -> Path:
        return self.root / "project"

    def prepare(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        self.project.mkdir(parents=True, exist_ok=True)
        (self.project / "README.md").write_text("# demo\n\nA tiny project used to test agents.\n")
        (self.project / "notes.txt").write_text("nothing to see\n")
        keep = ("PATH", "LANG", "LC_ALL", "TERM", "SYSTEMROOT", "TMPDIR")
        env = {k: v for k, v in os.environ.items() if k in keep}
        env.update(
            HOME=str(self.home),
            XDG_CONFIG_HOME=str(self.home / ".config"),
            XDG_DATA_HOME=str(self.home / ".local" / "share"),
            XDG_CACHE_HOME=str(self.home / ".cache"),
            XDG_STATE_HOME=str(self.home / ".local" / "state"),
            NO_COLOR="1",
        )
        for key in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
            env[key] = self.proxy
        env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
        self.env = env
        getattr(self, "_prepare_" + self.agent.name.replace("-", "_"))()

    def _template(self, name: str) -> str:
        return (EXAMPLES / name).read_text().replace("{BASE}", self.base).replace("{MODEL}", MODEL)

    def _env_file(self, name: str) -> None:
        for line in self._template(name).splitlines():
            if line and not line.startswith("#") and "=" in line:
                key, _, value = line.partition("=")
                self.env[key] = value

    def _prepare_claude_code(self) -> None:
        self._env_file("claude-code.env")

    def _prepare_codex(self) -> None:
        codex_home = self.home / ".codex"
        codex_home.mkdir(parents=True, exist_ok=True)
        (codex_home / "config.toml").write_text(self._template("codex-config.toml"))
        self.env["CODEX_HOME"] = str(codex_home)
        self.env["OPENAI_API_KEY"] = "sk-local"

    def _prepare_opencode(self) -> None:
        (self.project / "opencode.json").write_text(self._template("opencode.json"))
        self._env_file("opencode.env")

    def _prepare_hermes(self) -> None:
        hermes_home = self.home / "hermes"
        hermes_home.mkdir(parents=True, exist_ok=True)
        (hermes_home / "config.yaml").write_text(self._template("hermes-config.yaml"))
        # Its PyPI update check has no switch; a fresh answer in its cache (kept 6 h) stands in.
        stamp = {"ts": time.time(), "behind": 0, "rev": None, "ver": self.agent.version}
        (hermes_home / ".update_check").write_text(json.dumps(stamp))
        self.env["HERMES_HOME"] = str(hermes_home)
        self._env_file("hermes.env")

    def argv(self, turn: int) -> list[str]:
        """The command of the task's first prompt (turn 0) or of its follow-up in the same session."""
        exe = str(self.agent.bin_path())
        prompt = TASK if turn == 0 else FOLLOW_UP
        name = self.agent.name
        if name == "claude-code":
            more = [] if turn == 0 else ["--continue"]
            return [exe, "-p", prompt, *more, "--output-format", "json", "--model", MODEL, "--max-turns", "8"]
        if name == "codex":
            if turn == 0:
                return [exe, "exec", "--skip-git-repo-check", prompt]
            return [exe, "exec", "--skip-git-repo-check", "resume", "--last", prompt]
        if name == "opencode":
            more = [] if turn == 0 else ["--continue"]
            return [exe, "run", prompt, *more, "--model", f"local/{MODEL}"]
        more = [] if turn == 0 else ["--continue"]
        return [exe, "chat", "-q", prompt, "-Q", *more]

    def run(self, turn: int, timeout_s: float = 300.0) -> subprocess.CompletedProcess[str]:
        """Run one prompt to its end; its own process group, stopped by its PID if it overruns."""
        proc = subprocess.Popen(
            self.argv(turn),
            cwd=self.project,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            out, err = proc.communicate()
            err += f"\n(killed after {timeout_s:g} s)"
        (self.root / f"stdout-{turn}.txt").write_text(out)
        (self.root / f"stderr-{turn}.txt").write_text(err)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def own_files(self) -> Path | None:
        """Where the agent keeps its sessions, for an importer."""
        if self.agent.name == "claude-code":
            return self.home / ".claude" / "projects"
        if self.agent.name == "codex":
            return self.home / ".codex" / "sessions"
        if self.agent.name == "opencode":
            return self.home / ".local" / "share" / "opencode"
        return self.home / "hermes" / "state.db"


@contextmanager
def refusing_proxy() -> Iterator[RefusingProxy]:
    with RefusingProxy() as proxy:
        yield proxy
