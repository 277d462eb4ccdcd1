"""The README's quickstart, run verbatim as a reader would paste it.

The block between `<!-- quickstart -->` and `<!-- /quickstart -->` is run
with bash in an empty directory, with the built `oncelog` first on PATH. It
starts its own broker on the default ports (127.0.0.1:9092 and :9644), so
those must be free.
"""

import os
import re
import signal
import socket
import subprocess

import pytest

from conftest import REPO_ROOT, oncelog_bin


def quickstart():
    text = (REPO_ROOT / "README.md").read_text()
    m = re.search(r"<!-- quickstart -->\n```sh\n(.*?)```\n<!-- /quickstart -->", text, re.S)
    assert m, "README.md has no quickstart block"
    return m.group(1)


def port_free(port):
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


@pytest.mark.timeout(120)
def test_readme_quickstart_runs_verbatim(tmp_path):
    for port in (9092, 9644):
        assert port_free(port), f"the quickstart needs 127.0.0.1:{port} free"
    script = tmp_path / "quickstart.sh"
    script.write_text(quickstart())
    env = dict(os.environ)
    env["PATH"] = f"{oncelog_bin().parent}{os.pathsep}{env['PATH']}"
    env["NO_COLOR"] = "1"
    env.pop("ONCELOG_BOOTSTRAP", None)
    proc = subprocess.Popen(["bash", str(script)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=90)
    finally:
        # Whatever the script left running (it started it) goes with its group.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{out}\nstderr:\n{err}"
    lines = out.splitlines()
    # A was fenced, and said so; read_committed readers see trip-9001 once.
    assert "A was fenced" in lines, out
    assert lines.count("trip-9001") == 1, out
    assert "trip-9002" not in out, out
    # The describe shows the fence (its cause) for fare-writer-7.
    assert "fare-writer-7" in out and "newer_producer" in out, out
    # The broker stopped cleanly on `kill %1` and kept its data here.
    assert "stopped cleanly" in err, err
    assert (tmp_path / "oncelog-data" / "internal" / "__transaction_state-0").is_dir()
    assert port_free(9092)
