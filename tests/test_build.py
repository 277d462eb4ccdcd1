"""The broker and its CLI build without a C toolchain (`--no-default-features`):
no crate in that build has a C build step. Read from cargo's own dependency
graph, so it needs no second build."""

import shutil
import sys
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


CYCLES = REPO_ROOT / "scripts" / "module_cycles.py"


def cycles(src):
    return subprocess.run([sys.executable, str(CYCLES), str(src)],
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("crate", sorted(p.name for p in (REPO_ROOT / "crates").iterdir()
                                         if (p / "src").is_dir()))
def test_no_module_imports_another_that_imports_it_back(crate):
    p = cycles(REPO_ROOT / "crates" / crate / "src")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "no cycles" in p.stdout


def test_the_cycle_check_finds_a_cycle(tmp_path):
    (tmp_path / "lib.rs").write_text("pub mod a;\npub mod b;\n")
    (tmp_path / "a.rs").write_text("use crate::b::B;\npub struct A;\n")
    (tmp_path / "b.rs").write_text("pub struct B(crate::a::A);\n")
    p = cycles(tmp_path)
    assert p.returncode == 1 and "cycle: a <-> b" in p.stdout, p.stdout


def test_the_cycle_check_looks_inside_folders(tmp_path):
    """Two files of one folder that use each other (through `super::`), and a
    file of one folder using one of another folder that uses it back."""
    (tmp_path / "lib.rs").write_text("pub mod x;\npub mod y;\n")
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "mod.rs").write_text("pub mod a;\npub mod b;\npub use a::A;\n")
    (tmp_path / "x" / "a.rs").write_text("use super::b::{self, B};\npub struct A(B);\n")
    (tmp_path / "x" / "b.rs").write_text("pub struct B;\nfn f() { super::a::A; }\n")
    (tmp_path / "y").mkdir()
    (tmp_path / "y" / "mod.rs").write_text("pub mod c;\n")
    (tmp_path / "y" / "c.rs").write_text("pub struct C(crate::x::b::B);\n")
    p = cycles(tmp_path)
    assert p.returncode == 1 and "cycle: x::a <-> x::b" in p.stdout, p.stdout
    assert "y::c" not in "".join(l for l in p.stdout.splitlines() if l.startswith("cycle")), p.stdout
    (tmp_path / "x" / "b.rs").write_text("pub struct B;\nfn f() { crate::y::c::C; }\n")
    p = cycles(tmp_path)
    assert p.returncode == 1 and "cycle: x::b <-> y::c" in p.stdout, p.stdout
    # A folder's mod.rs may use its own files, and they it.
    (tmp_path / "x" / "b.rs").write_text("pub struct B;\nfn f() { super::A; }\n")
    (tmp_path / "x" / "a.rs").write_text("pub struct A;\n")
    (tmp_path / "x" / "mod.rs").write_text("pub mod a;\npub mod b;\npub use a::A;\nfn g() { b::B; }\n")
    p = cycles(tmp_path)
    assert p.returncode == 0 and "no cycles" in p.stdout, p.stdout
