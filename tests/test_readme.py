"""The README's quickstart, run verbatim as a reader would paste it.

The block between `<!-- quickstart -->` and `<!-- /quickstart -->` is run
with bash, with the built `oncelog` first on PATH and TMPDIR in the test's
own directory (the block makes its directory with mktemp). The block listens
on fixed ports (127.0.0.1:19092 and :19644), so where it can (as root) it
runs in a private network namespace of its own, where those ports are free
whatever else runs beside it; elsewhere they must be free.
"""

import os
import re
import shutil
import signal
import subprocess

import pytest

from conftest import REPO_ROOT, oncelog_bin, port_is_free

PORTS = (19092, 19644)


def quickstart():
    text = (REPO_ROOT / "README.md").read_text()
    m = re.search(r"<!-- quickstart -->\n```sh\n(.*?)```\n<!-- /quickstart -->", text, re.S)
    assert m, "README.md has no quickstart block"
    return m.group(1)


def private_network():
    """argv prefix that runs a command in a new network namespace with its
    loopback up, or None where that cannot be done."""
    if os.geteuid() != 0 or not (shutil.which("unshare") and shutil.which("ip")):
        return None
    probe = subprocess.run(["unshare", "--net", "ip", "link", "set", "lo", "up"],
                           capture_output=True, timeout=30)
    if probe.returncode != 0:
        return None
    return ["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$@"', "sh"]


def run_block(tmp_path, block):
    script = tmp_path / "quickstart.sh"
    script.write_text(block)
    env = dict(os.environ)
    env["PATH"] = f"{oncelog_bin().parent}{os.pathsep}{env['PATH']}"
    env["NO_COLOR"] = "1"
    env["TMPDIR"] = str(tmp_path)
    env.pop("ONCELOG_BOOTSTRAP", None)
    prefix = private_network()
    if prefix is None:
        for port in PORTS:
            assert port_is_free(port), f"the quickstart needs 127.0.0.1:{port} free"
    proc = subprocess.Popen([*(prefix or []), "bash", str(script)], cwd=tmp_path, env=env,
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
    return proc.returncode, out, err


@pytest.mark.timeout(200)
def test_readme_quickstart_runs_verbatim_and_twice(tmp_path):
    block = quickstart()
    for run in (1, 2):
        rc, out, err = run_block(tmp_path, block)
        assert rc == 0, f"run {run}: exit {rc}\nstdout:\n{out}\nstderr:\n{err}"
        lines = out.splitlines()
        # A was fenced, and said so; read_committed readers see trip-9001 once
        # (the second paste starts afresh: once again, not twice).
        assert "A was fenced" in lines, out
        assert lines.count("trip-9001") == 1, out
        assert "trip-9002" not in out, out
        # The describe shows the fence (its cause) for fare-writer-7.
        assert "fare-writer-7" in out and "newer_producer" in out, out
        # The broker stopped cleanly on SIGTERM and kept its data in the
        # block's own directory.
        assert "stopped cleanly" in lines[-1], out
        m = re.search(r"^quickstart in (\S+)$", out, re.M)
        assert m, out
        assert (tmp_path / m.group(1)).resolve().parent == tmp_path.resolve(), out
        data = tmp_path / m.group(1) / "oncelog-data"
        assert (data / "internal" / "__transaction_state-0").is_dir(), out


@pytest.mark.timeout(120)
def test_readme_quickstart_stops_when_its_port_is_taken(tmp_path):
    """With the port taken (by anything), the block stops at once with the
    broker's reason, and runs nothing against whatever holds the port."""
    block = quickstart()
    if private_network() is None:
        pytest.skip("needs a private network namespace (root, unshare, ip)")
    # (the taker's output goes elsewhere: the test reads the block's to its end)
    taker = "\n".join([
        "python3 - >/dev/null 2>&1 <<'PY' &",
        "import socket, time",
        "s = socket.socket(); s.bind(('127.0.0.1', 19092)); s.listen(); time.sleep(60)",
        "PY",
        "sleep 1",
    ])
    rc, out, err = run_block(tmp_path, taker + "\n" + block)
    assert rc != 0, out
    assert "already in use" in out + err, f"stdout:\n{out}\nstderr:\n{err}"
    assert "trip-9001" not in out, out
