"""The `oncelog` client commands run as a user would, against a live broker:
tables for people and --json for scripts; S4 seen through the CLI
(find-hanging, then abort, and read_committed readers resume)."""

import json
import subprocess
import time

from confluent_kafka import Consumer, TopicPartition

from clients import cli, consumer_config, read_partition, txn_producer, unique_topic
from conftest import both_modes, oncelog_bin


def test_topic_commands(broker):
    topic = unique_topic("cli")
    out, _ = cli(broker, "topic", "create", topic, "--partitions", "3", "--config", "retention.ms=60000")
    assert out == {"created": topic, "partitions": 3}
    listed, _ = cli(broker, "topic", "list")
    assert {"topic": topic, "partitions": 3} in listed
    table, _ = cli(broker, "topic", "list", json_out=False)
    assert table.splitlines()[0].split() == ["TOPIC", "PARTITIONS"]
    assert any(line.split() == [topic, "3"] for line in table.splitlines())
    desc, _ = cli(broker, "topic", "describe", topic)
    assert [p["partition"] for p in desc["partitions"]] == [0, 1, 2]
    assert all(p["high_watermark"] == 0 and p["last_stable_offset"] == 0 for p in desc["partitions"])
    _, p = cli(broker, "topic", "describe", "no-such-topic", check=False)
    assert p.returncode != 0 and "UnknownTopicOrPartition" in p.stderr
    out, _ = cli(broker, "topic", "delete", topic)
    assert out == {"deleted": topic}
    info, _ = cli(broker, "cluster", "info")
    assert info["brokers"][0]["port"] == broker.port
    assert any(a["api"] == "InitProducerId" for a in info["apis"])


def test_s4_through_the_cli(broker):
    topic = unique_topic("cli-s4")
    cli(broker, "topic", "create", topic, "--partitions", "2")
    old = txn_producer(broker.bootstrap, "fare-writer-7-a3f9")
    old.init_transactions(30)
    old.begin_transaction()
    old.produce(topic, value=b"orphan", partition=1)
    old.flush(30)
    time.sleep(0.3)
    hanging, _ = cli(broker, "txn", "find-hanging", "--min-age-ms", "100")
    assert [h["transactional_id"] for h in hanging] == ["fare-writer-7-a3f9"]
    assert hanging[0]["partitions"] == [f"{topic}-1"] and hanging[0]["age_ms"] >= 100
    table, _ = cli(broker, "txn", "find-hanging", "--min-age-ms", "100", json_out=False)
    assert table.splitlines()[0].split()[0] == "TRANSACTIONAL-ID" and f"{topic}-1" in table
    producers, _ = cli(broker, "txn", "producers", topic, "1")
    assert len(producers) == 1 and producers[0]["current_txn_start_offset"] == 0
    listed, _ = cli(broker, "txn", "list", "--state", "Ongoing")
    assert [t["transactional_id"] for t in listed] == ["fare-writer-7-a3f9"]
    p = producers[0]
    cli(broker, "txn", "abort", topic, "1", "--producer-id", str(p["producer_id"]),
        "--producer-epoch", str(p["epoch"]))
    desc, _ = cli(broker, "txn", "describe", "fare-writer-7-a3f9")
    assert desc["state"] == "CompleteAbort" and desc["producer_epoch"] == p["epoch"] + 1
    after, _ = cli(broker, "topic", "describe", topic)
    assert after["partitions"][1]["last_stable_offset"] == after["partitions"][1]["high_watermark"] == 2
    assert cli(broker, "txn", "find-hanging", "--min-age-ms", "0")[0] == []


def test_group_commands_show_lag(broker_factory):
    b = broker_factory({"group.initial.rebalance.delay.ms": 0})
    topic = unique_topic("cli-g")
    cli(b, "topic", "create", topic, "--partitions", "2")
    from confluent_kafka import Producer
    from clients import flush_all, producer_config
    p = Producer(producer_config(b.bootstrap))
    for i in range(10):
        p.produce(topic, value=b"v", partition=i % 2)
    flush_all(p)
    c = Consumer(consumer_config(b.bootstrap, **{"group.id": "cli-group"}))
    c.commit(offsets=[TopicPartition(topic, 0, 2), TopicPartition(topic, 1, 5)], asynchronous=False)
    c.close()
    groups, _ = cli(b, "group", "list")
    assert {"group": "cli-group", "state": "Empty", "protocol_type": ""} in groups
    desc, _ = cli(b, "group", "describe", "cli-group")
    lag = {(o["topic"], o["partition"]): (o["committed"], o["lag"]) for o in desc["offsets"]}
    assert lag == {(topic, 0): (2, 3), (topic, 1): (5, 0)}
    table, _ = cli(b, "group", "describe", "cli-group", json_out=False)
    assert "LAG" in table.splitlines()[1]


def run_cli(broker, *args, stdin=None, json_out=False):
    """Runs a data command with stdin; returns the finished process."""
    argv = [str(oncelog_bin()), *args, "--bootstrap", broker.bootstrap] + (["--json"] if json_out else [])
    return subprocess.run(argv, input=stdin, capture_output=True, timeout=120)


def test_produce_keys_headers_and_partitioning(broker):
    """`oncelog produce` writes keyed lines with headers; librdkafka reads them
    back, and each key lands where Kafka's murmur2 partitioner puts it."""
    from kafka.partitioner.default import murmur2
    topic = unique_topic("cli-p")
    cli(broker, "topic", "create", topic, "--partitions", "3")
    lines = b"".join(b"key-%d|value %d\n" % (i, i) for i in range(300))
    p = run_cli(broker, "produce", topic, "--key-separator", "|", "--header", "src=cli",
                "--batch-records", "70", stdin=lines, json_out=True)
    assert p.returncode == 0, p.stderr
    summary = json.loads(p.stdout)
    assert summary["records"] == 300 and summary["outcome"] == "acknowledged"
    from clients import consume_confluent
    seen = {}
    for part, recs in consume_confluent(broker.bootstrap, topic, [0, 1, 2]).items():
        assert len(recs) == summary["partitions"].get(str(part), 0)
        for r in recs:
            seen[r.key] = (part, r.value, r.headers)
    assert len(seen) == 300
    for i in range(300):
        key = b"key-%d" % i
        part, value, headers = seen[key]
        assert value == b"value %d" % i
        assert part == (murmur2(key) & 0x7FFFFFFF) % 3
        assert headers == [("src", b"cli")] or headers == (("src", b"cli"),), headers


def test_consume_formats_compression_and_positions(broker):
    """`oncelog consume` decodes what librdkafka wrote under every codec, from
    an offset or a time, and prints value, kv and json lines."""
    from confluent_kafka import Producer
    from clients import flush_all, producer_config
    topic = unique_topic("cli-c")
    cli(broker, "topic", "create", topic)
    base_ts = int(time.time() * 1000) - 100_000
    i = 0
    for codec in ["none", "gzip", "snappy", "lz4", "zstd"]:
        pr = Producer(producer_config(broker.bootstrap, **{"compression.type": codec}))
        for _ in range(20):
            pr.produce(topic, key=b"k%d" % i, value=b"v%d" % i, partition=0,
                       timestamp=base_ts + i * 1000, headers=[("n", str(i).encode())])
            i += 1
        flush_all(pr)
    p = run_cli(broker, "consume", topic)
    assert p.returncode == 0, p.stderr
    assert p.stdout.decode().splitlines() == ["v%d" % n for n in range(100)]
    assert b"consumed 100 records" in p.stderr
    p = run_cli(broker, "consume", topic, "--from", "95", "--format", "kv")
    assert p.stdout.decode().splitlines() == ["k%d\tv%d" % (n, n) for n in range(95, 100)]
    # by time, in the uncompressed batch (the broker's time lookup is exact
    # to the record there, and to the batch in compressed ones)
    p = run_cli(broker, "consume", topic, "--from", "@%d" % (base_ts + 12_500), "--format", "json",
                "--max-messages", "3")
    rows = [json.loads(x) for x in p.stdout.decode().splitlines()]
    assert [r["offset"] for r in rows] == [13, 14, 15]
    assert rows[0] == {"topic": topic, "partition": 0, "offset": 13, "timestamp": base_ts + 13_000,
                       "key": "k13", "value": "v13", "headers": {"n": "13"}}
    p = run_cli(broker, "consume", topic, "--from", "latest", "--timeout-ms", "500", "--follow")
    assert p.returncode == 0 and p.stdout == b""


def test_transactional_produce_and_isolation(broker):
    """`produce --transactional-id`: an aborted run is invisible to
    read_committed readers (librdkafka's and the CLI's own), a committed
    run becomes visible; read_uncommitted sees both."""
    topic = unique_topic("cli-tx")
    cli(broker, "topic", "create", topic)
    p = run_cli(broker, "produce", topic, "--transactional-id", "cli-tx-1", "--abort",
                stdin=b"a1\na2\na3\n")
    assert p.returncode == 0 and b"1 transactions aborted" in p.stderr, p.stderr
    p = run_cli(broker, "produce", topic, "--transactional-id", "cli-tx-1",
                "--transaction-records", "2", stdin=b"c1\nc2\nc3\nc4\nc5\n", json_out=True)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["transactions"] == 3
    committed = run_cli(broker, "consume", topic).stdout.decode().splitlines()
    assert committed == ["c1", "c2", "c3", "c4", "c5"]
    everything = run_cli(broker, "consume", topic, "--isolation", "read_uncommitted").stdout.decode().splitlines()
    assert everything == ["a1", "a2", "a3", "c1", "c2", "c3", "c4", "c5"]
    hw = run_cli(broker, "topic", "describe", topic, json_out=True)
    end = json.loads(hw.stdout)["partitions"][0]["high_watermark"]
    got = read_partition(broker.bootstrap, topic, 0, 0, "read_committed", end)
    assert [v for _, v in got] == [b"c1", b"c2", b"c3", b"c4", b"c5"]
    desc, _ = cli(broker, "txn", "describe", "cli-tx-1")
    assert desc["state"] == "CompleteCommit"


@both_modes()
def test_single_writer_refusal_surfaces_in_the_cli(broker):
    """S6 through the CLI: with writer.transactional.id.prefix set by
    `topic alter-config`, another prefix's transactional produce fails loudly
    and nothing of it becomes visible."""
    topic = unique_topic("cli-s6")
    cli(broker, "topic", "create", topic)
    out, _ = cli(broker, "topic", "alter-config", topic, "--set", "writer.transactional.id.prefix=blue-job")
    assert out == {"topic": topic, "configs": {"writer.transactional.id.prefix": "blue-job"}}
    desc, _ = cli(broker, "topic", "describe", topic)
    assert desc["configs"] == {"writer.transactional.id.prefix": "blue-job"}
    ok = run_cli(broker, "produce", topic, "--transactional-id", "blue-job-1", stdin=b"x\n")
    assert ok.returncode == 0, ok.stderr
    bad = run_cli(broker, "produce", topic, "--transactional-id", "green-job-1", stdin=b"y\n")
    assert bad.returncode != 0
    assert b"TransactionalIdAuthorizationFailed" in bad.stderr, bad.stderr
    assert 'refused transactional_id="green-job-1"' in broker.log_text()
    assert run_cli(broker, "consume", topic).stdout.decode().splitlines() == ["x"]
    out, _ = cli(broker, "topic", "alter-config", topic, "--delete", "writer.transactional.id.prefix")
    assert out["configs"] == {}
    _, p = cli(broker, "topic", "alter-config", topic, "--set", "no.such.config=1", check=False)
    assert p.returncode != 0 and "InvalidConfig" in p.stderr


def test_group_consume_reset_and_delete(broker_factory):
    """consume --group resumes where it left off; reset-offsets plans by
    default, applies with --execute, refuses while the group has members;
    group delete removes it."""
    b = broker_factory({"group.initial.rebalance.delay.ms": 0})
    topic = unique_topic("cli-gr")
    cli(b, "topic", "create", topic, "--partitions", "2")
    p = run_cli(b, "produce", topic, "--batch-records", "10", stdin=b"".join(b"%d\n" % i for i in range(40)))
    assert p.returncode == 0, p.stderr
    first = run_cli(b, "consume", topic, "--group", "g-cli", "--max-messages", "15")
    assert len(first.stdout.splitlines()) == 15
    rest = run_cli(b, "consume", topic, "--group", "g-cli")
    assert len(rest.stdout.splitlines()) == 25
    assert sorted(first.stdout.splitlines() + rest.stdout.splitlines(), key=int) == [b"%d" % i for i in range(40)]
    desc, _ = cli(b, "group", "describe", "g-cli")
    assert all(o["lag"] == 0 for o in desc["offsets"]) and sum(o["committed"] for o in desc["offsets"]) == 40
    plan, _ = cli(b, "group", "reset-offsets", "g-cli", "--topic", topic, "--shift-by", "-5")
    assert not plan["executed"] and all(x["new"] == x["current"] - 5 for x in plan["partitions"])
    desc, _ = cli(b, "group", "describe", "g-cli")
    assert sum(o["committed"] for o in desc["offsets"]) == 40
    done, _ = cli(b, "group", "reset-offsets", "g-cli", "--topic", topic, "--partition", "1", "--to-earliest", "--execute")
    assert done["executed"] and done["partitions"] == [{"partition": 1, "current": desc_committed(desc, 1), "new": 0}]
    again = run_cli(b, "consume", topic, "--group", "g-cli")
    assert len(again.stdout.splitlines()) == desc_committed(desc, 1)
    c = Consumer(consumer_config(b.bootstrap, **{"group.id": "g-cli"}))
    c.subscribe([topic])
    from conftest import wait_until
    wait_until(lambda: (c.poll(0.2), c.assignment())[1], 30, what="assignment")
    _, p = cli(b, "group", "reset-offsets", "g-cli", "--topic", topic, "--to-latest", "--execute", check=False)
    assert p.returncode != 0 and "members" in p.stderr
    c.close()
    out, _ = cli(b, "group", "delete", "g-cli")
    assert out == {"deleted": "g-cli"}
    groups, _ = cli(b, "group", "list")
    assert "g-cli" not in [g["group"] for g in groups]


def desc_committed(desc, partition):
    return next(o["committed"] for o in desc["offsets"] if o["partition"] == partition)


# ------------------------------------------------ the Kafka tools' habits

def test_the_kafka_tools_spellings(broker):
    """What kafka-topics, kafka-console-consumer, rpk and kcat taught their
    users works: -b/--bootstrap-server/--brokers, topic create -p/-r/-c,
    produce/consume -p, consume -o/-g/-n/-c, --from beginning|start|end and
    --from-beginning; a replication factor the broker cannot keep is the
    broker's refusal, with its reason."""
    topic = unique_topic("cli-habits")
    bin_ = str(oncelog_bin())

    def run(*args, stdin=None):
        return subprocess.run([bin_, *args], input=stdin, capture_output=True, text=True, timeout=60)

    p = run("topic", "create", topic, "-p", "2", "-r", "1", "-c", "retention.ms=60000",
            "-b", broker.bootstrap, "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == {"created": topic, "partitions": 2}
    for flag in ["-b", "--bootstrap-server", "--brokers"]:
        p = run("topic", "list", flag, broker.bootstrap, "--json")
        assert p.returncode == 0, (flag, p.stderr)
        assert {"topic": topic, "partitions": 2} in json.loads(p.stdout), flag
    desc, _ = cli(broker, "topic", "describe", topic)
    assert desc["configs"] == {"retention.ms": "60000"}
    p = run("topic", "create", topic + "-rf", "--replication-factor", "3", "-b", broker.bootstrap)
    assert p.returncode == 1
    assert "InvalidReplicationFactor" in p.stderr and "keeps one copy of each partition" in p.stderr, p.stderr
    assert topic + "-rf" not in [t["topic"] for t in cli(broker, "topic", "list")[0]]
    p = run("topic", "create", topic + "-rf", "-r", "0", "-b", broker.bootstrap)
    assert p.returncode == 2 and "replication-factor" in p.stderr, p.stderr

    p = run("produce", topic, "-p", "1", "-b", broker.bootstrap, stdin="a\nb\nc\n")
    assert p.returncode == 0, p.stderr
    for start in [["-o", "beginning"], ["--from", "start"], ["--from", "earliest"], ["--from-beginning"], []]:
        p = run("consume", topic, "-p", "1", *start, "-b", broker.bootstrap)
        assert p.returncode == 0 and p.stdout.splitlines() == ["a", "b", "c"], (start, p.stderr)
    for count in ["-n", "-c", "--count", "--num", "--max-messages"]:
        p = run("consume", topic, "--from", "beginning", count, "2", "-b", broker.bootstrap)
        assert p.stdout.splitlines() == ["a", "b"], (count, p.stderr)
    p = run("consume", topic, "--from", "end", "-b", broker.bootstrap)
    assert p.returncode == 0 and p.stdout == "", p.stderr
    p = run("consume", topic, "-o", "-1", "-p", "1", "-b", broker.bootstrap)
    assert p.stdout.splitlines() == ["c"], p.stderr
    p = run("consume", topic, "--from", "first", "-b", broker.bootstrap)
    assert p.returncode == 1 and "--from must be earliest (or beginning, start), latest (or end)" in p.stderr
    p = run("consume", topic, "--from-beginning", "--from", "end", "-b", broker.bootstrap)
    assert p.returncode == 2 and "cannot be used with" in p.stderr, p.stderr
    p = run("consume", topic, "-g", "habits", "-n", "1", "-b", broker.bootstrap)
    assert p.returncode == 0 and "committed group habits" in p.stderr, p.stderr
    desc, _ = cli(broker, "group", "describe", "habits")
    assert sum(o["committed"] for o in desc["offsets"]) == 1
    p = run("topic", "add-partitions", topic, "--partitions", "3", "-b", broker.bootstrap, "--json")
    assert p.returncode == 0 and json.loads(p.stdout) == {"topic": topic, "partitions": 3}, p.stderr


def test_empty_listings_say_none(broker_factory):
    """A listing with nothing in it says `none`, not bare headers; --json
    stays an empty array."""
    b = broker_factory()
    for args in [("topic", "list"), ("group", "list"), ("txn", "list"), ("txn", "find-hanging"),
                 ("user", "list")]:
        text, _ = cli(b, *args, json_out=False)
        assert text == "none\n", (args, text)
        out, _ = cli(b, *args)
        assert out == [], (args, out)


def test_security_options_have_one_help_heading():
    """The TLS/SASL client options are listed once, under their own heading,
    not among every command's own options; they still work as before."""
    for args in [(), ("topic", "list"), ("consume",)]:
        p = subprocess.run([str(oncelog_bin()), *args, "--help"], capture_output=True, text=True,
                           timeout=30)
        assert p.returncode == 0, p.stderr
        own, heading, security = p.stdout.partition("Security (Kafka client settings):")
        assert heading, (args, p.stdout)
        assert "--sasl" not in own and "--security-protocol" not in own, (args, own)
        for flag in ["--security-protocol", "--sasl-mechanism", "--sasl-username", "--sasl-password",
                     "--ca-cert", "--cert ", "--cert-key", "--command-config"]:
            assert flag in security, (args, flag)
        if args == ("topic", "list"):
            assert "-b, --bootstrap" in own and "--bootstrap-server" in own
    p = subprocess.run([str(oncelog_bin()), "topic", "list", "--security-protocol", "NOPE"],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and "unknown security protocol NOPE" in p.stderr


def test_output_piped_into_head_ends_quietly():
    """`oncelog completions bash | head -2`: no panic, nothing on stderr,
    whichever way the shell reports the writer's end."""
    for shell in ["bash", "zsh", "fish"]:
        p = subprocess.run(["bash", "-c", f"set +o pipefail; '{oncelog_bin()}' completions {shell} | head -2"],
                           capture_output=True, text=True, timeout=30)
        assert p.returncode == 0, (shell, p.returncode, p.stderr)
        assert p.stderr == "" and "panicked" not in p.stdout, (shell, p.stderr)
        assert len(p.stdout.splitlines()) == 2, (shell, p.stdout)
        # the writer's own status: 0 or 141 (SIGPIPE), never a panic's 101
        q = subprocess.run(["bash", "-c", f"'{oncelog_bin()}' completions {shell} | head -c 10 >/dev/null;"
                                          " echo ${PIPESTATUS[0]}"],
                           capture_output=True, text=True, timeout=30)
        assert q.stdout.strip() in ("0", "141") and q.stderr == "", (shell, q.stdout, q.stderr)


def test_the_start_up_log_names_the_console(broker):
    addr = broker.overrides["metrics.listen"]
    assert f"console: http://{addr}/" in broker.log_text()
