"""The generated reference pages against a running broker.

docs/protocol.md's table is generated from the code (a cargo test keeps it
so); here a real `oncelog serve` of each mode is asked ApiVersions and its
answer must be the page's versions, API by API (both modes serve the same). docs/
configuration.md must name every setting `oncelog serve --help` lists.
"""

import re
import subprocess

import pytest

import kafka_wire as w
from conftest import REPO_ROOT, both_modes, oncelog_bin


def page_versions():
    """{api key: (min, max)} of docs/protocol.md's table (without
    `transaction.two.phase.commit.enable`)."""
    text = (REPO_ROOT / "docs" / "protocol.md").read_text()
    out = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[1].isdigit():
            continue
        m = re.match(r"(\d+)–(\d+)", cells[2])
        if m:
            out[int(cells[1])] = (int(m.group(1)), int(m.group(2)))
        else:
            assert cells[2] == "—", line
    assert out, "docs/protocol.md has no API table"
    return out


@both_modes()
def test_protocol_page_is_what_api_versions_answers(broker):
    with w.Conn(broker.host, broker.port) as c:
        c.send(w.api_versions_request(0, 7))
        err, apis = w.parse_api_versions_v0_response(c.recv_response(7))
    assert err == w.NONE
    page = page_versions()
    assert apis == page, (
        f"ApiVersions of a {broker.mode} broker and docs/protocol.md differ: "
        f"only served {sorted(set(apis) - set(page))}, only on the page "
        f"{sorted(set(page) - set(apis))}, ranges "
        f"{ {k: (apis[k], page[k]) for k in set(apis) & set(page) if apis[k] != page[k]} }")


def test_configuration_page_names_every_setting_of_serve_help():
    out = subprocess.run([str(oncelog_bin()), "serve", "--help"], capture_output=True,
                         text=True, timeout=30, check=True).stdout
    settings = re.findall(r"^  ([a-z][a-z0-9.]+) +default ", out, re.M)
    assert len(settings) > 40, out
    page = (REPO_ROOT / "docs" / "configuration.md").read_text()
    missing = [s for s in settings if f"| `{s}` |" not in page]
    assert not missing, f"settings of `oncelog serve --help` not in docs/configuration.md: {missing}"
