"""A guarded run in its own process, so tests can end it every way a real run ends.

usage: guard_scenario.py MODE SERVICE_TOML SERVER_PORT OUT_DIR
MODE: normal | exception | wait | timeout | stranger
Prints RUNNING once the daily service is stopped and the test server is up; writes the test
server's PID to OUT_DIR/child.pid.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

from drivers.guard import Guard, load_guard_config
from drivers.process import ChildProcess
from replay.errors import ReplayError

FAKE = str(Path(__file__).with_name("fake_server.py"))


def run(mode: str, toml: str, server_port: int, out: Path) -> None:
    config = load_guard_config(toml)
    with Guard(config, max_duration=2.5 if mode == "timeout" else None) as guard:
        child = ChildProcess(
            [sys.executable, FAKE, "line", str(server_port), "0", str(out / "child.terms")],
            log_path=out / "child.log",
            stop_timeout=5,
        )
        guard.adopt(child)
        with child:
            child.wait_for_line("listening on", timeout=5)
            (out / "child.pid").write_text(str(child.pid))
            print("RUNNING", flush=True)
            if mode == "exception":
                raise RuntimeError("boom")
            if mode in ("wait", "timeout"):
                time.sleep(30)
            if mode == "stranger":
                assert config.service is not None and config.service.port is not None
                code = (
                    "import socket, time; s = socket.socket(); "
                    "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
                    f"s.bind(('127.0.0.1', {config.service.port})); s.listen(); print('bound', flush=True); "
                    "time.sleep(60)"
                )
                stranger = subprocess.Popen(
                    [sys.executable, "-c", code],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                    text=True,
                )
                assert stranger.stdout is not None and stranger.stdout.readline() == "bound\n"
                (out / "stranger.pid").write_text(str(stranger.pid))
                socket.create_connection(("127.0.0.1", config.service.port)).close()


def main() -> int:
    mode, toml, port, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
    try:
        run(mode, toml, port, out)
    except KeyboardInterrupt:
        print("exit: KeyboardInterrupt", file=sys.stderr)
        return 130
    except ReplayError as e:
        print(f"exit: {type(e).__name__}: {e}", file=sys.stderr)
        return e.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
