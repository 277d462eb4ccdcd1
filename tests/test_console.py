"""The web console (`/` on the broker's HTTP port) in headless Chromium,
against a real `oncelog serve` under scripted scenarios with librdkafka
clients: the zombie fare writer of the seeds (the fence with both epochs and
who fenced whom), a hanging transaction (the transaction that pins the LSO,
its age and producer, and what resolves it), a second writer prefix on one
topic, a consumer group's members, lag and pending transactional offsets,
and the actions: none without `console.actions.enable`, each after a
confirmation, behind a SCRAM password with SASL listeners. Screenshots go to
target/console-screenshots/."""

import base64
import json
import re
import subprocess
import time
import urllib.error
import urllib.request

import pytest
from confluent_kafka import Consumer, KafkaException, TopicPartition

from browser import browser_errors, click, screenshot, start_chromium, text_of, wait_for
from clients import consumer_config, create_topic, txn_producer, unique_topic
from conftest import both_modes, free_port, oncelog_bin, wait_until
from test_txn_history import late_write


@pytest.fixture(scope="module")
def chrome():
    d = start_chromium()
    yield d
    d.quit()


def console_broker(factory, **extra):
    port = free_port()
    overrides = {"metrics.listen": f"127.0.0.1:{port}", "group.initial.rebalance.delay.ms": 0}
    overrides.update(extra)
    b = factory(overrides)
    b.admin = f"http://127.0.0.1:{port}"
    return b


def http(b, method, path, headers=None):
    req = urllib.request.Request(b.admin + path, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def open_view(driver, b, hash_):
    if not driver.current_url.startswith(b.admin):
        # a page of an earlier test's broker (stopped since) may have logged
        # failed polls: start clean
        driver.get("about:blank")
        browser_errors(driver)
    driver.get(f"{b.admin}/#{hash_}")
    wait_for(driver, lambda d: d.find_element("id", "view").get_attribute("data-state") == "ready",
             what=f"view {hash_} to load")


def no_page_errors(driver):
    errors = browser_errors(driver)
    assert not errors, f"the page logged errors: {errors}"


def console_offsets(b, topic, partition=0):
    """(last stable offset, high watermark) of a partition as the console's
    topic view serves them."""
    with urllib.request.urlopen(f"{b.admin}/v1/console/topic?topic={topic}", timeout=10) as r:
        rows = json.loads(r.read())["partitions"]["rows"]
    row = next(x for x in rows if x["partition"] == partition)
    return row["last_stable_offset"], row["high_watermark"]


@pytest.mark.timeout(180)
def test_zombie_fare_writer_fence_shows_both_epochs_and_the_fencer(broker_factory, chrome):
    """Seed story 1: fare-writer's old instance is fenced by its replacement;
    the timeline and the id's page show the fence (newer_producer, 0 → 1,
    the new instance's client id and address) and the zombie's refused write."""
    b = console_broker(broker_factory)
    topic = unique_topic("fares")
    create_topic(b.bootstrap, topic)
    tid = "fare-writer-7"
    old = txn_producer(b.bootstrap, tid, **{"client.id": "fare-writer-old"})
    old.init_transactions(30)
    old.begin_transaction()
    old.produce(topic, value=b"trip-1", partition=0)
    old.flush(30)
    new = txn_producer(b.bootstrap, tid, **{"client.id": "fare-writer-new"})
    new.init_transactions(30)
    late_write(old, topic)
    new.begin_transaction()
    new.produce(topic, value=b"trip-2", partition=0)
    new.commit_transaction(30)

    open_view(chrome, b, "/transactions?prefix=fare-writer")
    lane_css = f'.lane[data-id="{tid}"]'
    lane = wait_for(chrome, lambda d: text_of(d, lane_css), what="the fare-writer lane")
    assert "writer fare-writer" in lane, lane
    assert re.search(r"fenced 0→1 \(newer_producer\) by fare-writer-new 127\.0\.0\.1:\d+", lane), lane
    marks = [e.text for e in chrome.find_elements("css selector", f"{lane_css} .mark.fence")]
    assert "⚡0→1" in marks, marks
    assert chrome.find_elements("css selector", f"{lane_css} .bar.commit"), "the new instance's commit bar"
    assert chrome.find_elements("css selector", f"{lane_css} .bar.abort"), "the zombie's aborted transaction"
    assert chrome.find_elements("css selector", f"{lane_css} .mark.rejected"), "the zombie's refused write"
    screenshot(chrome, "transactions-zombie-fence")

    # the id's page: the fence row, who held which epoch, the markers
    chrome.find_element("css selector", f"{lane_css} .who a").click()
    wait_for(chrome, lambda d: "fare-writer-new" in text_of(d, "#fences"), what="the fence table")
    fences = text_of(chrome, "#fences")
    assert re.search(r"newer_producer 0 → 1 fare-writer-new 127\.0\.0\.1:\d+ yes " + re.escape(f"{topic}-0"), fences), fences
    page = text_of(chrome, "#view")
    assert "fare-writer-old" in page and "CompleteCommit" in page, page
    markers = text_of(chrome, "#markers")
    # the zombie's transaction began at offset 0, its ABORT marker at 1; the
    # new instance's record at 2 (the late write was refused), COMMIT at 3
    assert re.search(r"COMMIT \d+/1 " + re.escape(f"{topic}-0") + r" 2 3", markers), markers
    assert re.search(r"ABORT \d+/\d+ " + re.escape(f"{topic}-0") + r" 0 1", markers), markers
    screenshot(chrome, "transaction-detail-fence")
    no_page_errors(chrome)


@pytest.mark.timeout(180)
def test_hanging_transaction_pins_the_lso_and_the_console_says_which(broker_factory, chrome):
    """A transaction left open pins its partition's LSO: the stuck view names
    it (transactional id, producer id and epoch, its client, its age, rising
    live) and says what resolves it; read-only, there is no button and a
    POST from the page itself changes nothing."""
    b = console_broker(broker_factory)
    topic = unique_topic("orders")
    create_topic(b.bootstrap, topic)
    tid = "billing-7"
    hang = txn_producer(b.bootstrap, tid, **{"client.id": "billing-app", "transaction.timeout.ms": 120000})
    hang.init_transactions(30)
    hang.begin_transaction()
    hang.produce(topic, value=b"held", partition=0)
    hang.flush(30)
    other = txn_producer(b.bootstrap, "copier-1", **{"client.id": "copier"})
    other.init_transactions(30)
    for i in range(3):
        other.begin_transaction()
        other.produce(topic, value=b"after-%d" % i, partition=0)
        other.commit_transaction(30)
    wait_until(lambda: console_offsets(b, topic) == (0, 7) or None, 10, what="LSO 0 and HW 7")

    open_view(chrome, b, "/stuck")
    row_css = f'#stuck tr[data-partition="{topic}-0"]'
    row = wait_for(chrome, lambda d: text_of(d, row_css), what="the pinned partition")
    assert tid in row and "billing-app @ 127.0.0.1:" in row, row
    assert re.search(r"producer \d+ epoch 0 · from offset 0", row), row
    assert "open" in row and "Ongoing" in row, row
    assert f"oncelog txn abort {topic} 0 --producer-id" in row, row
    age = lambda: int(re.search(r"(\d+) s", text_of(chrome, f"{row_css} .age")).group(1))
    first = age()
    wait_for(chrome, lambda d: age() >= first + 2, timeout=6, what="the age to rise on its own (live updates)")
    assert not chrome.find_elements("css selector", f"{row_css} button"), "read-only: no action buttons"
    screenshot(chrome, "stuck-hanging-transaction")

    # the page's own script POSTs an abort: refused, and nothing changed
    pid = int(re.search(r"producer (\d+) epoch", row).group(1))
    status = chrome.execute_async_script("""
        const done = arguments[arguments.length - 1];
        fetch('/v1/console/actions/abort?topic=%s&partition=0&producer_id=%d&epoch=0', {method: 'POST'})
          .then(r => done(r.status)).catch(e => done(String(e)));""" % (topic, pid))
    assert status == 403
    browser_errors(chrome)  # drains the log of that expected 403
    assert console_offsets(b, topic) == (0, 7)
    assert "console action refused" in b.log_text()

    # the overview counts the pinned partition; the producer can still commit
    open_view(chrome, b, "/overview")
    trow = wait_for(chrome, lambda d: text_of(d, f'#topics tr[data-topic="{topic}"]'), what="the topic row")
    assert "copier" in trow, trow
    hang.commit_transaction(30)
    wait_for(chrome, lambda d: text_of(d, f'#topics tr[data-topic="{topic}"]').split()[3] == "0",
             what="the LSO gap to close")
    open_view(chrome, b, "/stuck")
    wait_for(chrome, lambda d: d.find_elements("id", "nothing-stuck"), what="nothing stuck")
    no_page_errors(chrome)


@pytest.mark.timeout(180)
def test_two_writer_prefixes_on_one_topic(broker_factory, chrome):
    """Two jobs commit to one topic: the overview shows both writers with a
    warning; with the writer fence set it shows the fence."""
    b = console_broker(broker_factory)
    topic = unique_topic("revenue")
    create_topic(b.bootstrap, topic)
    for tid in ("orders-blue-0-1", "orders-green-0-1"):
        p = txn_producer(b.bootstrap, tid)
        p.init_transactions(30)
        p.begin_transaction()
        p.produce(topic, value=tid.encode(), partition=0)
        p.commit_transaction(30)
    open_view(chrome, b, "/overview")
    row_css = f'#topics tr[data-topic="{topic}"] .writers'
    writers = wait_for(chrome, lambda d: text_of(d, row_css), what="the writers cell")
    assert "2 writers" in writers and "orders-blue" in writers and "orders-green" in writers, writers
    screenshot(chrome, "overview-two-writers")
    # health and rates are drawn
    assert chrome.find_elements("css selector", "#rates .spark svg polyline")
    assert "commits / aborts" in text_of(chrome, "#health")
    # the topic page names both writers too
    chrome.find_element("css selector", f'#topics tr[data-topic="{topic}"] a').click()
    wait_for(chrome, lambda d: "orders-green" in text_of(d, "#view"), what="the topic page")
    no_page_errors(chrome)


@pytest.mark.timeout(180)
def test_group_members_lag_and_pending_transactional_offsets(broker_factory, chrome):
    b = console_broker(broker_factory)
    topic = unique_topic("in")
    create_topic(b.bootstrap, topic, partitions=2)
    p = txn_producer(b.bootstrap, "loader-1")
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(10):
        p.produce(topic, value=b"v%d" % i, partition=i % 2)
    p.commit_transaction(30)
    group = "billing-readers"
    c = Consumer(consumer_config(b.bootstrap, **{"group.id": group, "client.id": "reader-1",
                                                 "isolation.level": "read_committed",
                                                 "auto.offset.reset": "earliest",
                                                 "enable.auto.offset.store": True,
                                                 "session.timeout.ms": 10000}))
    c.subscribe([topic])
    got = []
    deadline = time.monotonic() + 30
    while len(got) < 4 and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and not m.error():
            got.append(m)
    assert got, "the consumer read nothing"
    c.commit(asynchronous=False)
    # a copier's transactional offset commit, left open
    cp = txn_producer(b.bootstrap, "copier-9")
    cp.init_transactions(30)
    cp.begin_transaction()
    cp.produce(topic, value=b"copied", partition=0)
    cp.send_offsets_to_transaction([TopicPartition(topic, 1, 3)], c.consumer_group_metadata(), 30)
    try:
        open_view(chrome, b, "/groups")
        wait_for(chrome, lambda d: group in text_of(d, "#view"), what="the group row")
        chrome.find_element("link text", group).click()
        page = wait_for(chrome, lambda d: "reader-1" in text_of(d, "#view") and text_of(d, "#view"), what="the group page")
        assert f"{topic} [0,1]" in page, page
        assert "copier-9" in page and f"{topic}-1" in page, page
        screenshot(chrome, "group-pending-offsets")
        no_page_errors(chrome)
    finally:
        cp.abort_transaction(30)
        c.close()


def basic(user, password):
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest.mark.timeout(240)
def test_actions_need_enabling_a_confirmation_and_a_password(broker_factory, chrome):
    """No console request changes state unless console.actions.enable is
    set; then an abort is a button, a confirmation and an aborted
    transaction; a parked transaction is committed from the page; a cut-over
    is started and rolled back from the page; cross-site and rebinding
    requests are refused."""
    # read-only broker: every action endpoint refuses and nothing changes
    ro = console_broker(broker_factory)
    topic = unique_topic("ro")
    create_topic(ro.bootstrap, topic)
    for path in ("/v1/console/actions/abort?topic=%s&partition=0&producer_id=0&epoch=0" % topic,
                 "/v1/console/actions/resolve?id=x&producer_id=0&epoch=0&outcome=commit",
                 "/v1/console/actions/cutover-start?topic=%s&from=a&to=b" % topic,
                 "/v1/console/actions/cutover-rollback?topic=%s" % topic):
        assert http(ro, "POST", path)[0] == 403, path
    assert http(ro, "POST", "/v1/console/overview")[0] == 405
    assert http(ro, "GET", "/v1/console/actions/abort")[0] == 405
    assert json.loads(http(ro, "GET", "/v1/cutover")[1])["cutovers"] == []
    # another site's page cannot start a cut-over through the CLI's endpoint either
    code, _ = http(ro, "POST", f"/v1/cutover/start?topic={topic}&from=a-job&to=b-job",
                   {"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"})
    assert code == 403
    assert json.loads(http(ro, "GET", "/v1/cutover")[1])["cutovers"] == []
    # DNS rebinding: a Host that is no IP, localhost or allowed name
    assert http(ro, "GET", "/v1/console/overview", {"Host": "evil.example"})[0] == 421

    # actions enabled, parked transactions for the "flink-" writer
    b = console_broker(broker_factory, **{"console.actions.enable": "true",
                                          "transaction.two.phase.commit.prefixes": "flink-sink"})
    topic = unique_topic("acts")
    create_topic(b.bootstrap, topic)
    hang = txn_producer(b.bootstrap, "hanging-1", **{"client.id": "hanging-app"})
    hang.init_transactions(30)
    hang.begin_transaction()
    hang.produce(topic, value=b"held", partition=0)
    hang.flush(30)
    wait_until(lambda: console_offsets(b, topic)[1] == 1 or None, 10, what="HW 1")

    open_view(chrome, b, "/stuck")
    row_css = f'#stuck tr[data-partition="{topic}-0"]'
    wait_for(chrome, lambda d: d.find_elements("css selector", f"{row_css} button[data-action=abort]"), what="the abort button")
    click(chrome, f"{row_css} button[data-action=abort]", "the abort button")
    wait_for(chrome, lambda d: d.find_element("id", "confirm").get_attribute("open") is not None, what="the confirmation")
    assert "oncelog txn abort" in chrome.find_element("id", "confirm-cli").text
    screenshot(chrome, "action-confirmation")
    # cancelling changes nothing
    chrome.find_element("id", "confirm-cancel").click()
    time.sleep(0.5)
    assert console_offsets(b, topic) == (0, 1)
    click(chrome, f"{row_css} button[data-action=abort]", "the abort button")
    wait_for(chrome, lambda d: d.find_element("id", "confirm").get_attribute("open") is not None, what="the confirmation")
    chrome.find_element("id", "confirm-ok").click()
    wait_until(lambda: console_offsets(b, topic) == (2, 2) or None, 15,
               what="the abort marker to release the LSO")
    wait_for(chrome, lambda d: d.find_elements("id", "nothing-stuck"), what="nothing stuck")
    assert re.search(r"console action done.*action=\"?abort", b.log_text()), b.log_tail()
    with pytest.raises(KafkaException):
        hang.commit_transaction(30)  # fenced by the abort
    # the same abort again finds nothing to abort and changes nothing
    pid = json.loads(http(b, "GET", "/v1/console/transaction?id=hanging-1")[1])["producer_id"]
    code, body = http(b, "POST", f"/v1/console/actions/abort?topic={topic}&partition=0&producer_id={pid}&epoch=0")
    assert code == 409 and "no open transaction" in body, body
    assert console_offsets(b, topic) == (2, 2)

    # a parked transaction: committed from the page
    park = txn_producer(b.bootstrap, "flink-sink-0-5", **{"transaction.timeout.ms": 2000, "message.timeout.ms": 2000})
    park.init_transactions(30)
    park.begin_transaction()
    park.produce(topic, value=b"checkpointed", partition=0)
    park.flush(30)
    parked = lambda: json.loads(http(b, "GET", "/v1/transactions/parked")[1])["parked"]
    wait_until(lambda: parked() or None, 20, what="the transaction to park")
    open_view(chrome, b, "/stuck")
    btn = f"{row_css} button[data-action=resolve]"
    wait_for(chrome, lambda d: len(d.find_elements("css selector", btn)) == 2, what="commit and abort buttons")
    assert "parked" in text_of(chrome, row_css)
    chrome.find_elements("css selector", btn)[0].click()  # Commit
    wait_for(chrome, lambda d: d.find_element("id", "confirm").get_attribute("open") is not None, what="the confirmation")
    chrome.find_element("id", "confirm-ok").click()
    wait_until(lambda: not parked() or None, 15, what="the parked transaction to be committed")
    code, body = http(b, "POST", "/v1/console/actions/resolve?id=flink-sink-0-5&producer_id=0&epoch=0&outcome=abort")
    assert code == 409 and "no parked transaction" in body, body
    # the coordinator answers once the commit is decided; its markers follow
    # a moment later (as in Kafka), and then the LSO reaches the high watermark
    wait_until(lambda: (lambda o: o[0] == o[1] == 4)(console_offsets(b, topic)) or None, 15,
               what="the commit marker to release the LSO")
    c = Consumer(consumer_config(b.bootstrap, **{"isolation.level": "read_committed", "enable.partition.eof": True}))
    c.assign([TopicPartition(topic, 0, 0)])
    seen = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is None:
            continue
        if m.error():
            break
        seen.append(m.value())
    c.close()
    assert seen == [b"checkpointed"], seen

    # a cut-over from the topic page, then its rollback
    open_view(chrome, b, f"/topic/{topic}")
    wait_for(chrome, lambda d: d.find_elements("id", "cutover-form"), what="the cut-over form")
    chrome.find_element("id", "cutover-from").clear()
    chrome.find_element("id", "cutover-from").send_keys("orders-blue")
    chrome.find_element("id", "cutover-to").send_keys("orders-green")
    chrome.find_element("css selector", "button[data-action=cutover-start]").click()
    wait_for(chrome, lambda d: d.find_element("id", "confirm").get_attribute("open") is not None, what="the confirmation")
    assert "--from orders-blue --to orders-green" in chrome.find_element("id", "confirm-cli").text
    chrome.find_element("id", "confirm-ok").click()
    status = lambda: json.loads(http(b, "GET", f"/v1/cutover?topic={topic}")[1])
    wait_until(lambda: status().get("phase") == "Switched" or None, 20, what="the cut-over to switch")
    # nothing of orders-blue holds the topic, so it switched at once; a new
    # one can be started and rolled back while draining
    no_page_errors(chrome)


@pytest.mark.timeout(120)
def test_actions_with_sasl_need_a_scram_password_and_alter_on_the_cluster(broker_factory):
    """With a SASL listener an action needs a SCRAM user's password (HTTP
    Basic); with an authorizer, ALTER on the cluster (a super user has it)."""
    http_port, sasl_port = free_port(), free_port()
    b = broker_factory({"metrics.listen": f"127.0.0.1:{http_port}"}, start=False)
    b.overrides.update({
        "listeners": f"PLAINTEXT://127.0.0.1:{b.port},SASL_PLAINTEXT://127.0.0.1:{sasl_port}",
        "console.actions.enable": "true",
        "authorizer.class.name": "oncelog",
        "super.users": "User:admin;User:ANONYMOUS",
    })
    b.start()
    b.admin = f"http://127.0.0.1:{http_port}"
    for user, pw in (("admin", "admin-secret"), ("alice", "alice-secret")):
        p = subprocess.run([str(oncelog_bin()), "user", "create", user, "--password", pw,
                            "--bootstrap", b.bootstrap], capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
    assert json.loads(http(b, "GET", "/v1/console/actions")[1]) == {"enabled": True, "authentication": "basic"}
    path = "/v1/console/actions/cutover-rollback?topic=nothing"
    code, body = http(b, "POST", path)
    assert code == 401 and "SCRAM" in body
    assert http(b, "POST", path, {"Authorization": basic("admin", "wrong")})[0] == 401
    assert http(b, "POST", path, {"Authorization": basic("nobody", "x")})[0] == 401
    code, body = http(b, "POST", path, {"Authorization": basic("alice", "alice-secret")})
    assert code == 403 and "ALTER" in body, body
    # the super user passes both checks; the rollback itself is refused
    # (there is no cut-over), which shows the action ran
    code, body = http(b, "POST", path, {"Authorization": basic("admin", "admin-secret")})
    assert code == 409, body
    assert "console action refused" in b.log_text() and 'principal=User:admin' in b.log_text()

    # the CLI's cut-over endpoint needs the same: refused without a
    # password, done by the CLI with its SASL settings
    topic = unique_topic("guarded")
    create_topic(b.bootstrap, topic)
    code, body = http(b, "POST", f"/v1/cutover/start?topic={topic}&from=a-job&to=b-job")
    assert code == 401, body
    assert json.loads(http(b, "GET", "/v1/cutover")[1])["cutovers"] == []
    cli = [str(oncelog_bin()), "cutover", "start", topic, "--from", "a-job", "--to", "b-job",
           "--admin", b.admin, "--bootstrap", f"127.0.0.1:{sasl_port}", "--security-protocol", "SASL_PLAINTEXT",
           "--sasl-mechanism", "SCRAM-SHA-512", "--sasl-username", "alice", "--sasl-password", "alice-secret"]
    p = subprocess.run(cli, capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "ALTER" in p.stderr, (p.stdout, p.stderr)
    cli[cli.index("alice")] = "admin"
    cli[cli.index("alice-secret")] = "admin-secret"
    p = subprocess.run(cli, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, (p.stdout, p.stderr)
    assert [c["topic"] for c in json.loads(http(b, "GET", "/v1/cutover")[1])["cutovers"]] == [topic]


@pytest.mark.timeout(240)
def test_big_lists_are_paged(broker_factory, chrome):
    """Thousands of partitions and hundreds of transactional ids: every view
    sends one page (its JSON stays small), and the page's pager walks them."""
    from confluent_kafka.admin import AdminClient, NewTopic
    import concurrent.futures
    b = console_broker(broker_factory)
    admin = AdminClient({"bootstrap.servers": b.bootstrap, "broker.address.family": "v4"})
    names = [f"many-{i:02d}" for i in range(60)]
    fs = admin.create_topics([NewTopic(t, 2, 1) for t in names] + [NewTopic("wide", 2000, 1)],
                             request_timeout=120)
    for f in fs.values():
        f.result(180)

    def one(i):
        p = txn_producer(b.bootstrap, f"batch-{i}")
        p.init_transactions(60)
        p.begin_transaction()
        p.produce("wide", value=b"x", partition=i)
        p.commit_transaction(60)

    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        list(ex.map(one, range(120)))
    sizes = {}
    for path in ("/v1/console/overview", "/v1/console/topic?topic=wide",
                 "/v1/console/transactions", "/v1/console/stuck", "/v1/console/groups"):
        code, body = http(b, "GET", path)
        assert code == 200, (path, body)
        sizes[path] = len(body)
    assert max(sizes.values()) < 200_000, sizes
    ov = json.loads(http(b, "GET", "/v1/console/overview")[1])
    assert (ov["totals"]["partitions"], ov["topics"]["total"], ov["topics"]["pages"]) == (2120, 61, 2)
    wide = json.loads(http(b, "GET", "/v1/console/topic?topic=wide&page=40")[1])["partitions"]
    assert (wide["pages"], wide["page"], [r["partition"] for r in wide["rows"]][:2]) == (40, 40, [1950, 1951])
    lanes = json.loads(http(b, "GET", "/v1/console/transactions?per_page=25&prefix=batch")[1])["lanes"]
    assert (lanes["total"], lanes["pages"], len(lanes["rows"])) == (120, 5, 25)

    open_view(chrome, b, "/overview")
    wait_for(chrome, lambda d: "page 1 of 2" in text_of(d, "#view"), what="the topics pager")
    chrome.find_element("xpath", "//button[contains(., 'next')]").click()
    wait_for(chrome, lambda d: "page 2 of 2" in text_of(d, "#view") and d.find_elements("css selector", '#topics tr[data-topic="wide"]'),
             what="page 2 with the wide topic")
    open_view(chrome, b, "/transactions?prefix=batch")
    wait_for(chrome, lambda d: len(d.find_elements("css selector", ".lane")) == 25, what="25 lanes")
    assert "page 1 of 5 (120 rows)" in text_of(chrome, "#view")
    no_page_errors(chrome)


class _Console:
    """One broker's console (its HTTP listener)."""

    def __init__(self, broker):
        self.admin = broker.metrics_url
        self.broker = broker


@pytest.mark.timeout(240)
@pytest.mark.parametrize("broker_factory", ["cluster"], indirect=True)
def test_a_clusters_console_shows_and_acts_on_the_whole_cluster_through_any_broker(broker_factory, chrome):
    """Three `--cluster` brokers: a transaction left open through one
    broker's listener pins its partition, and every broker's console shows
    the cluster's topics, offsets and the pinning transaction with its
    client; an abort from another broker's console fences it through its
    coordinator; a parked transaction is committed from a third; a cut-over
    is started and rolled back; the id's page and the timeline show the
    cluster's history; a consumer group's members, assignment and lag show
    through every broker."""
    c = broker_factory({"console.actions.enable": "true",
                        "transaction.two.phase.commit.prefixes": "flink-sink",
                        "group.initial.rebalance.delay.ms": 0})
    one, two, three = (_Console(x) for x in c.brokers)
    first = c.brokers[0].bootstrap
    topic = unique_topic("orders")
    create_topic(c.bootstrap, topic)
    hang = txn_producer(first, "billing-7", **{"client.id": "billing-app", "transaction.timeout.ms": 120000})
    hang.init_transactions(30)
    hang.begin_transaction()
    hang.produce(topic, value=b"held", partition=0)
    hang.flush(30)
    other = txn_producer(first, "copier-1", **{"client.id": "copier"})
    other.init_transactions(30)
    for i in range(2):
        other.begin_transaction()
        other.produce(topic, value=b"after-%d" % i, partition=0)
        other.commit_transaction(30)
    for x in (one, two, three):
        wait_until(lambda: console_offsets(x, topic) == (0, 5) or None, 15, what="LSO 0 and HW 5 on every broker")

    # the stuck view of the third broker names the transaction and its client
    open_view(chrome, three, "/stuck")
    row_css = f'#stuck tr[data-partition="{topic}-0"]'
    row = wait_for(chrome, lambda d: text_of(d, row_css), what="the pinned partition")
    assert "billing-7" in row and "billing-app @ 127.0.0.1:" in row, row
    assert "open" in row and "Ongoing" in row, row
    assert chrome.find_elements("css selector", f"{row_css} button[data-action=abort]"), "actions are on"
    # the overview of the second counts it, with the topic's writer
    overview = json.loads(http(two, "GET", "/v1/console/overview")[1])
    trow = next(r for r in overview["topics"]["rows"] if r["topic"] == topic)
    assert (trow["lso_gap"], trow["pinned_partitions"]) == (5, 1), trow
    assert [w["prefix"] for w in trow["writers"]] == ["copier"], trow
    assert trow["size_bytes"] > 0, trow
    parts = json.loads(http(one, "GET", f"/v1/console/topic?topic={topic}")[1])["partitions"]["rows"]
    assert parts[0]["open"][0]["transactional_id"] == "billing-7", parts

    # an abort from the second broker's console: through the coordinator
    pid = parts[0]["open"][0]["producer_id"]
    code, body = http(two, "POST", f"/v1/console/actions/abort?topic={topic}&partition=0&producer_id={pid}&epoch=0")
    assert code == 200 and "through the coordinator" in body, body
    for x in (one, two, three):
        wait_until(lambda: console_offsets(x, topic) == (6, 6) or None, 15, what="the abort marker on every broker")
    with pytest.raises(KafkaException):
        hang.commit_transaction(30)
    code, body = http(three, "POST", f"/v1/console/actions/abort?topic={topic}&partition=0&producer_id={pid}&epoch=0")
    assert code == 409 and "no open transaction" in body, body
    wait_for(chrome, lambda d: d.find_elements("id", "nothing-stuck"), what="nothing stuck on the third")

    # a parked transaction, committed from the first broker's console
    park = txn_producer(c.brokers[1].bootstrap, "flink-sink-0-5",
                        **{"transaction.timeout.ms": 2000, "message.timeout.ms": 2000})
    park.init_transactions(30)
    park.begin_transaction()
    park.produce(topic, value=b"checkpointed", partition=0)
    park.flush(30)
    parked = lambda: json.loads(http(three, "GET", "/v1/transactions/parked")[1])["parked"]
    wait_until(lambda: parked() or None, 20, what="the transaction to park")
    p = parked()[0]
    stuck = json.loads(http(one, "GET", "/v1/console/stuck")[1])["partitions"]["rows"]
    assert stuck[0]["pinned_by"]["kind"] == "parked", stuck
    code, body = http(one, "POST", f"/v1/console/actions/resolve?id=flink-sink-0-5&producer_id={p['producer_id']}"
                                   f"&epoch={p['producer_epoch']}&outcome=commit")
    assert code == 200, body
    wait_until(lambda: console_offsets(two, topic) == (8, 8) or None, 15, what="the commit marker")
    code, body = http(two, "POST", "/v1/console/actions/resolve?id=flink-sink-0-5&producer_id=0&epoch=0&outcome=abort")
    assert code == 409 and "no parked transaction" in body, body

    # a cut-over from one broker's console, seen and rolled back through another
    code, body = http(three, "POST", f"/v1/console/actions/cutover-start?topic={topic}&from=orders-blue&to=orders-green")
    assert code == 200 and json.loads(body)["result"]["phase"] in ("Draining", "Switched"), body
    topic_view = json.loads(http(one, "GET", f"/v1/console/topic?topic={topic}")[1])
    assert topic_view["cutover"]["to"] == "orders-green", topic_view
    code, body = http(one, "POST", f"/v1/console/actions/cutover-rollback?topic={topic}")
    assert code in (200, 409), body  # 409 once it switched at once: nothing of orders-blue held it
    # the id's page and the timeline through any broker: the cluster's history
    txn = json.loads(http(three, "GET", "/v1/console/transaction?id=billing-7")[1])
    assert txn["known"] and txn["history"].get("persisted") is True, txn
    assert any(f["cause"] == "administrator" for f in txn["history"]["fences"]), txn["history"]
    lanes = json.loads(http(one, "GET", "/v1/console/transactions?window_ms=600000")[1])["lanes"]["rows"]
    ids = {lane["transactional_id"]: lane for lane in lanes}
    assert {"billing-7", "copier-1", "flink-sink-0-5"} <= set(ids), ids.keys()
    assert ids["billing-7"]["fences"] == 1 and ids["copier-1"]["events"], ids
    open_view(chrome, two, "/transactions")
    wait_for(chrome, lambda d: "billing-7" in d.find_element("id", "view").text, what="the timeline's lanes")
    # a consumer group: its members and lag through a broker that does not
    # coordinate it (as its coordinator last saw it at rest)
    group = "fares-" + topic
    consumer = Consumer(consumer_config(c.bootstrap, **{"group.id": group, "isolation.level": "read_committed",
                                                        "auto.offset.reset": "earliest", "client.id": "fares-app",
                                                        "enable.auto.offset.store": True}))
    consumer.subscribe([topic])
    try:
        seen = []
        deadline = time.monotonic() + 30
        while len(seen) < 3 and time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is not None and not m.error():
                seen.append(m.value())
        assert seen == [b"after-0", b"after-1", b"checkpointed"], seen
        consumer.commit(asynchronous=False)
        committed = consumer.committed([TopicPartition(topic, 0)], timeout=10)[0].offset

        def described(x):
            code, body = http(x, "GET", f"/v1/console/group?group={group}")
            v = json.loads(body) if code == 200 else {}
            return v if v.get("members") and v.get("offsets", {}).get("rows") else None
        for x in (one, two, three):
            v = wait_until(lambda: described(x), 20, what=f"the group's members through {x.admin}")
            assert v["state"] == "Stable" and v["members"][0]["client_id"] == "fares-app", v
            assert v["members"][0]["assignment"] == [{"topic": topic, "partitions": [0]}], v
            row = v["offsets"]["rows"][0]
            assert row["committed"] == committed and row["lag_committed"] == row["last_stable_offset"] - committed, v
        listed = json.loads(http(two, "GET", "/v1/console/groups")[1])["groups"]["rows"]
        assert [(g["group"], g["members"], g["state"]) for g in listed] == [(group, 1, "Stable")], listed
        open_view(chrome, three, f"/group/{group}")
        wait_for(chrome, lambda d: "fares-app" in d.find_element("id", "view").text, what="the group's page")
    finally:
        consumer.close()
    assert any("console action done" in x.log_text() for x in c.brokers)
    no_page_errors(chrome)


@pytest.mark.timeout(180)
@both_modes("broker_factory")
def test_partition_sizes_and_where_each_end_of_a_transaction_went(broker_factory):
    """The console's topic view gives each partition's size, and a
    transactional id's page says where each of its commits and aborts
    went: the partition, the transaction's first offset there and its
    marker's offset. Alike in both modes, through every broker."""
    b = broker_factory()
    consoles = [_Console(x) for x in getattr(b, "brokers", None) or [b]]
    topic = unique_topic("fares")
    create_topic(b.bootstrap, topic)
    p = txn_producer(b.bootstrap, "ends-" + topic)
    p.init_transactions(30)
    for values, commit in (([b"a", b"b"], True), ([b"c"], False), ([b"d"], True)):
        p.begin_transaction()
        for v in values:
            p.produce(topic, value=v, partition=0)
        p.flush(30)
        p.commit_transaction(30) if commit else p.abort_transaction(30)
        time.sleep(0.2)  # ends apart in time: the page pairs an end with its marker by time
    # offsets 0-1 committed (marker 2), 3 aborted (marker 4), 5 committed (marker 6)
    want = [(True, 0, 2), (False, 3, 4), (True, 5, 6)]
    for x in consoles:
        wait_until(lambda: console_offsets(x, topic) == (7, 7) or None, 15, what="every marker")
        rows = json.loads(http(x, "GET", f"/v1/console/topic?topic={topic}")[1])["partitions"]["rows"]
        assert rows[0]["size_bytes"] > 0, rows
        page = json.loads(http(x, "GET", f"/v1/console/transaction?id=ends-{topic}")[1])
        got = sorted(((m["commit"], m["first_offset"], m["marker_offset"]) for m in page["markers"]
                      if m["partition"] == f"{topic}-0"), key=lambda m: m[2])
        assert got == want, page["markers"]


@pytest.mark.timeout(180)
@both_modes("broker_factory")
def test_a_rebalance_in_progress_shows_through_every_broker(broker_factory):
    """A group's state at each step of a rebalance, not only at rest,
    shows in the console of every broker: a first member held in
    PreparingRebalance by group.initial.rebalance.delay.ms is seen as such
    through brokers that do not coordinate the group, then Stable."""
    b = broker_factory({"group.initial.rebalance.delay.ms": 6000})
    consoles = [_Console(x) for x in getattr(b, "brokers", None) or [b]]
    topic = unique_topic("rides")
    create_topic(b.bootstrap, topic)
    group = "riders-" + topic

    def state(x):
        rows = json.loads(http(x, "GET", f"/v1/console/groups?q={group}")[1])["groups"]["rows"]
        row = next((r for r in rows if r["group"] == group), None)
        return row and (row["state"], row["members"])

    consumer = Consumer(consumer_config(b.bootstrap, **{"group.id": group, "auto.offset.reset": "earliest"}))
    consumer.subscribe([topic])
    try:
        consumer.poll(0.5)
        for x in consoles:
            wait_until(lambda: state(x) == ("PreparingRebalance", 1) or None, 5,
                       what="the joining member, held back by the initial delay")
        deadline = time.monotonic() + 30
        while not consumer.assignment() and time.monotonic() < deadline:
            consumer.poll(0.5)
        for x in consoles:
            wait_until(lambda: state(x) == ("Stable", 1) or None, 15, what="the group at rest")
    finally:
        consumer.close()


@pytest.mark.timeout(180)
def test_the_verification_view_shows_progress_and_a_doubled_order(broker_factory, chrome):
    """Live verification in the console: each partition verified through
    its LSO, and the seed's doubled order (one order id committed by two
    writers) shown as an anomaly naming both."""
    b = console_broker(broker_factory, **{"verify.scrub.interval.ms": 500})
    topic = unique_topic("v-console")
    create_topic(b.bootstrap, topic, 2, config={"verify.unique.key": "/order_id"})
    open_view(chrome, b, "/verify")
    wait_for(chrome, lambda d: "none" in text_of(d, "#verify-found"), what="no anomaly yet")
    for tid in ("orders-sink-0", "orders-sink-v2-0"):
        p = txn_producer(b.bootstrap, tid)
        p.init_transactions(30)
        p.begin_transaction()
        for i in range(4):
            p.produce(topic, value=json.dumps({"order_id": f"o-{i}" if i == 3 or tid == "orders-sink-0" else f"v2-{i}"}),
                      partition=i % 2)
        p.commit_transaction(30)
    row_css = '#verify-anomalies tr[data-kind="duplicate_key"]'
    row = wait_for(chrome, lambda d: text_of(d, row_css), what="the doubled order's row")
    assert "o-3" in row and "orders-sink-0" in row and "orders-sink-v2-0" in row, row
    assert f"{topic}-1" in row, row
    wait_for(chrome, lambda d: "1" in text_of(d, "#verify-found"), what="one anomaly counted")
    part = wait_for(chrome, lambda d: (t := text_of(d, f'#verify-partitions tr[data-partition="{topic}-0"]'))
                    and t.split()[1] == t.split()[2] and t, what="partition 0 verified through its LSO")
    assert part.split()[1] != "0", part
    screenshot(chrome, "verification-doubled-order")
    no_page_errors(chrome)
