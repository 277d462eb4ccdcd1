"""The broker and its CLI build without a C toolchain (`--no-default-features`):
no crate in that build has a C build step. Read from cargo's own dependency
graph, so it needs no second build."""

import shutil
import subprocess

import pytest

from conftest import REPO_ROOT

# Build-time crates that compile C (or link a C library).
C_BUILDERS = ("cc", "cmake", "pkg-config", "rdkafka-sys", "libz-sys", "zstd-sys", "lz4-sys")


def tree(*args):
    cargo = shutil.which("cargo")
    if cargo is None:
        pytest.fail("cargo not found on PATH", pytrace=False)
    p = subprocess.run([cargo, "tree", "--offline", "-p", "oncelog", "-e", "normal,build",
                        "--prefix", "none", "--format", "{p}", *args],
                       cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return {line.split()[0] for line in p.stdout.splitlines() if line.strip()}


@pytest.mark.timeout(300)
def test_without_default_features_nothing_compiles_c():
    full = tree()
    lean = tree("--no-default-features")
    # the default build does have them (so the check below can fail)
    assert {"rdkafka-sys", "cc"} <= full, sorted(full)
    assert "oncelog-broker" in lean and "oncelog-client" in lean
    assert not (set(C_BUILDERS) & lean), sorted(set(C_BUILDERS) & lean)
