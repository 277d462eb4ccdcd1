"""librdkafka's own integration tests against oncelog.

The release build already compiles librdkafka from source (the `rdkafka-sys`
crate, for `oncelog audit`); its tests/ directory comes with it. This module
builds librdkafka's `test-runner` from that tree once (into
.tools/librdkafka-tests, a copy, so the cargo build tree is never touched)
and runs chosen tests against a real `oncelog serve`:

* 0011 produce_batch: batch produce, partitioners, and keyless records in a
  compacted topic failing with per-record errors (KIP-467);
* 0129 fetch_aborted_msgs: a read_committed consumer over aborted
  transactions.

Tests of librdkafka's suite that need a 3-broker cluster (replication factor
3) or Kafka's own command-line tools are not run here.
"""

import os
import shutil
import subprocess

import pytest

from conftest import REPO_ROOT

TESTS = ["0011", "0129"]
BUILD = REPO_ROOT / ".tools" / "librdkafka-tests"


def _source_tree():
    """The librdkafka tree of the newest rdkafka-sys build with its tests."""
    build = REPO_ROOT / "target" / "release" / "build"
    trees = [d / "out" for d in build.glob("rdkafka-sys-*")
             if (d / "out" / "tests" / "Makefile").is_file() and (d / "out" / "src" / "librdkafka.a").is_file()]
    return max(trees, key=lambda d: (d / "src" / "librdkafka.a").stat().st_mtime, default=None)


@pytest.fixture(scope="module")
def test_runner():
    src = _source_tree()
    if src is None:
        pytest.fail("no librdkafka source tree under target/release/build (run `cargo build --release`)",
                    pytrace=False)
    stamp = BUILD / "built-from"
    runner = BUILD / "tests" / "test-runner"
    if not (runner.is_file() and stamp.is_file() and stamp.read_text() == str(src)):
        if BUILD.exists():
            shutil.rmtree(BUILD)
        shutil.copytree(src, BUILD, symlinks=True)
        for target in (["-C", "src-cpp"], ["-C", "tests", "test-runner"]):
            p = subprocess.run(["make", "-j2", *target], cwd=BUILD, capture_output=True, text=True,
                               timeout=1200)
            assert p.returncode == 0, f"make {target} failed:\n{p.stdout[-3000:]}{p.stderr[-3000:]}"
        stamp.write_text(str(src))
    return runner


@pytest.mark.timeout(600)
@pytest.mark.parametrize("number", TESTS)
def test_librdkafka(test_runner, broker_factory, tmp_path, number):
    b = broker_factory({"log.cleaner.backoff.ms": "500"})
    conf = tmp_path / "test.conf"
    conf.write_text(f"bootstrap.servers={b.bootstrap}\n")
    env = dict(os.environ,
               TESTS=number,
               RDKAFKA_TEST_CONF=str(conf),
               TEST_KAFKA_VERSION="4.0.0",
               LD_LIBRARY_PATH=f"{BUILD / 'src'}:{BUILD / 'src-cpp'}")
    p = subprocess.run([str(test_runner)], cwd=test_runner.parent, env=env,
                       capture_output=True, text=True, timeout=540)
    out = p.stdout + p.stderr
    print(out[-4000:])
    assert p.returncode == 0, f"librdkafka test {number} failed:\n{out[-6000:]}"
    assert "ALL TESTS PASSED" in out
