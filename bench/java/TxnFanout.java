// Transactions per second with many concurrent transactional producers: what a
// Flink / Kafka Streams job with high parallelism does at every checkpoint.
//
// N threads, each with its own KafkaProducer (transactional.id = PREFIX-i),
// loop begin -> 1 record to partition (2i)%P + 1 record to (2i+1)%P -> commit,
// so every transaction spans 2 partitions. All threads initTransactions()
// first, then start together; commits that finish in the W s warm-up are not
// counted, the next S s are measured. Prints one JSON line on stdout.
//
//   javac -cp '.tools/java-lib/*' -d .tools/bench-java bench/java/TxnFanout.java
//   java -Xmx1g -cp '.tools/bench-java:.tools/java-lib/*' TxnFanout \
//       --bootstrap 127.0.0.1:9092 --topic fanout --partitions 64 \
//       --producers 64 --seconds 10 --warmup 3 [--size 100] [--id-prefix fanout]
//
// Bounded: System.exit after S + W + 120 s whatever happens (then the JSON
// line carries "timed_out":true and whatever was measured).

import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;
import java.util.Random;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.consumer.ConsumerGroupMetadata;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.AuthorizationException;
import org.apache.kafka.common.errors.InvalidProducerEpochException;
import org.apache.kafka.common.errors.OutOfOrderSequenceException;
import org.apache.kafka.common.errors.ProducerFencedException;
import org.apache.kafka.common.errors.TopicExistsException;
import org.apache.kafka.common.errors.UnsupportedVersionException;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class TxnFanout {
    static String bootstrap = "127.0.0.1:9092";
    static String topic = "txn-fanout";
    static int partitions = 64;
    static int producers = 8;
    static double seconds = 10;
    static double warmup = 3;
    static int size = 100;
    static String idPrefix = "txn-fanout";

    // Shared state, read by the final report (also on the hard deadline).
    static final AtomicLong errors = new AtomicLong();
    static final AtomicInteger stoppedThreads = new AtomicInteger();
    static final Map<String, Integer> errorKinds = new ConcurrentHashMap<>();
    static final List<String> errorSamples = Collections.synchronizedList(new ArrayList<>());
    static final AtomicBoolean reported = new AtomicBoolean();
    static volatile long measureStartNs;   // commits finishing at or after this count
    static volatile long deadlineNs;       // no transaction starts after this; commits after it do not count
    static volatile double initSeconds = Double.NaN;
    static Worker[] workers;

    static void usage(String why) {
        System.err.println("TxnFanout: " + why);
        System.err.println("usage: TxnFanout --bootstrap H:P --topic T --partitions P --producers N "
                + "--seconds S --warmup W [--size BYTES] [--id-prefix PREFIX] [--offsets-group PREFIX]");
        System.exit(2);
    }

    static void parse(String[] args) {
        for (int i = 0; i < args.length; i++) {
            String a = args[i];
            if (i + 1 >= args.length) usage("missing value for " + a);
            String v = args[++i];
            try {
                switch (a) {
                    case "--bootstrap": bootstrap = v; break;
                    case "--topic": topic = v; break;
                    case "--partitions": partitions = Integer.parseInt(v); break;
                    case "--producers": producers = Integer.parseInt(v); break;
                    case "--seconds": seconds = Double.parseDouble(v); break;
                    case "--warmup": warmup = Double.parseDouble(v); break;
                    case "--size": size = Integer.parseInt(v); break;
                    case "--id-prefix": idPrefix = v; break;
                    case "--offsets-group": offsetsGroup = v; break;
                    default: usage("unknown argument " + a);
                }
            } catch (NumberFormatException e) {
                usage("bad number for " + a + ": " + v);
            }
        }
        if (partitions < 1 || producers < 1 || seconds <= 0 || warmup < 0 || size < 0) usage("bad values");
    }

    /** With --offsets-group G each transaction also commits an offset for group G-<producer>. */
    static String offsetsGroup = null;

    static void noteError(int thread, String where, Throwable e) {
        errors.incrementAndGet();
        String kind = where + ":" + e.getClass().getSimpleName();
        errorKinds.merge(kind, 1, Integer::sum);
        if (errorSamples.size() < 10) {
            String msg = "producer " + thread + " " + where + ": " + e;
            errorSamples.add(msg);
            System.err.println(msg);
        }
    }

    /** Errors after which this producer cannot go on (fenced, fatal state). */
    static boolean fatal(Throwable e) {
        if (e instanceof KafkaException && e.getCause() != null && e.getCause() != e && fatal(e.getCause())) return true;
        return e instanceof ProducerFencedException || e instanceof OutOfOrderSequenceException
                || e instanceof AuthorizationException || e instanceof UnsupportedVersionException
                || e instanceof InvalidProducerEpochException || e instanceof IllegalStateException;
    }

    static final class Worker implements Runnable {
        final int id;
        final CountDownLatch ready, go;
        // grown on demand; read by the report after the worker finished (or at the hard deadline)
        volatile long[] commitLat = new long[1 << 12], txnLat = new long[1 << 12];
        volatile int count;
        volatile KafkaProducer<byte[], byte[]> producer;
        long offsetsSent;

        Worker(int id, CountDownLatch ready, CountDownLatch go) {
            this.id = id;
            this.ready = ready;
            this.go = go;
        }

        void record(long commitDur, long txnDur) {
            long[] c = commitLat, t = txnLat;
            int n = count;
            if (n == c.length) {
                c = Arrays.copyOf(c, n * 2);
                t = Arrays.copyOf(t, n * 2);
                commitLat = c;
                txnLat = t;
            }
            c[n] = commitDur;
            t[n] = txnDur;
            count = n + 1;
        }

        @Override
        public void run() {
            try {
                try {
                    Properties p = new Properties();
                    p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
                    p.put(ProducerConfig.CLIENT_ID_CONFIG, idPrefix + "-" + id);
                    p.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, idPrefix + "-" + id);
                    p.put(ProducerConfig.ACKS_CONFIG, "all");
                    p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
                    p.put(ProducerConfig.LINGER_MS_CONFIG, "0");
                    p.put(ProducerConfig.BUFFER_MEMORY_CONFIG, String.valueOf(1 << 20));
                    p.put(ProducerConfig.TRANSACTION_TIMEOUT_CONFIG, "60000");
                    p.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, "60000");
                    p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
                    p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
                    producer = new KafkaProducer<>(p);
                    producer.initTransactions();
                } catch (Throwable e) {
                    noteError(id, "init", e);
                    stoppedThreads.incrementAndGet();
                    return;
                } finally {
                    ready.countDown();
                }
                go.await();
                loop();
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            } finally {
                KafkaProducer<byte[], byte[]> pr = producer;
                if (pr != null) {
                    try {
                        pr.close(Duration.ofSeconds(5));
                    } catch (Throwable e) {
                        noteError(id, "close", e);
                    }
                }
            }
        }

        void loop() {
            byte[] value = new byte[size];
            new Random(id).nextBytes(value);
            int p0 = (2 * id) % partitions, p1 = (2 * id + 1) % partitions;
            KafkaProducer<byte[], byte[]> pr = producer;
            while (System.nanoTime() < deadlineNs) {
                long t0 = System.nanoTime();
                String stage = "begin";
                try {
                    pr.beginTransaction();
                    stage = "send";
                    // A record refused by the client or the broker shows up
                    // here first (the commit then fails with its own error).
                    final int self = id;
                    org.apache.kafka.clients.producer.Callback cb = (md, ex) -> {
                        if (ex != null) noteError(self, "send", ex);
                    };
                    pr.send(new ProducerRecord<>(topic, p0, null, value), cb);
                    pr.send(new ProducerRecord<>(topic, p1, null, value), cb);
                    if (offsetsGroup != null) {
                        // What an exactly-once consume-transform-produce job does:
                        // the input position commits with the transaction.
                        stage = "offsets";
                        pr.sendOffsetsToTransaction(
                                Map.of(new TopicPartition(topic, p0), new OffsetAndMetadata(++offsetsSent)),
                                new ConsumerGroupMetadata(offsetsGroup + "-" + id, -1, "", Optional.empty()));
                    }
                    stage = "commit";
                    long c0 = System.nanoTime();
                    pr.commitTransaction();
                    long end = System.nanoTime();
                    if (end >= measureStartNs && end <= deadlineNs) record(end - c0, end - t0);
                } catch (Throwable e) {
                    noteError(id, stage, e);
                    if (fatal(e)) {
                        stoppedThreads.incrementAndGet();
                        return;
                    }
                    try {
                        pr.abortTransaction();
                    } catch (Throwable e2) {
                        noteError(id, "abort", e2);
                        stoppedThreads.incrementAndGet();
                        return;
                    }
                }
            }
        }
    }

    static void ensureTopic() throws Exception {
        Properties p = new Properties();
        p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, "30000");
        p.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "60000");
        try (Admin admin = Admin.create(p)) {
            Set<String> names = admin.listTopics().names().get(60, TimeUnit.SECONDS);
            if (!names.contains(topic)) {
                try {
                    admin.createTopics(List.of(new NewTopic(topic, partitions, (short) 1)))
                            .all().get(60, TimeUnit.SECONDS);
                } catch (ExecutionException e) {
                    if (!(e.getCause() instanceof TopicExistsException)) throw e;
                }
            }
            // wait until every partition has a leader
            long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(60);
            while (true) {
                try {
                    TopicDescription d = admin.describeTopics(List.of(topic)).allTopicNames()
                            .get(30, TimeUnit.SECONDS).get(topic);
                    int have = d.partitions().size();
                    boolean led = d.partitions().stream().allMatch(x -> x.leader() != null && !x.leader().isEmpty());
                    if (have < partitions) {
                        throw new IllegalStateException("topic " + topic + " has " + have + " partitions, need " + partitions);
                    }
                    if (led) return;
                } catch (ExecutionException e) {
                    if (System.nanoTime() > end) throw e;
                }
                if (System.nanoTime() > end) throw new IllegalStateException("topic " + topic + " has no leaders after 60 s");
                Thread.sleep(100);
            }
        }
    }

    static double pct(long[] sorted, int n, double p) {
        if (n == 0) return Double.NaN;
        int i = (int) Math.round(p / 100.0 * (n - 1));
        return sorted[Math.min(n - 1, Math.max(0, i))] / 1e6;
    }

    static String num(double v) {
        if (Double.isNaN(v) || Double.isInfinite(v)) return "null";
        return String.format(Locale.ROOT, "%.3f", v);
    }

    static String str(String s) {
        StringBuilder b = new StringBuilder("\"");
        for (char c : s.toCharArray()) {
            if (c == '"' || c == '\\') b.append('\\').append(c);
            else if (c < 0x20) b.append(String.format("\\u%04x", (int) c));
            else b.append(c);
        }
        return b.append('"').toString();
    }

    static synchronized void report(boolean timedOut, String failure) {
        if (!reported.compareAndSet(false, true)) return;
        int total = 0;
        Worker[] ws = workers == null ? new Worker[0] : workers;
        for (Worker w : ws) if (w != null) total += w.count;
        long[] c = new long[total], t = new long[total];
        int k = 0;
        for (Worker w : ws) {
            if (w == null) continue;
            int n = Math.min(w.count, w.commitLat.length);
            long[] cl = w.commitLat, tl = w.txnLat;
            n = Math.min(n, Math.min(cl.length, tl.length));
            System.arraycopy(cl, 0, c, k, n);
            System.arraycopy(tl, 0, t, k, n);
            k += n;
        }
        Arrays.sort(c, 0, k);
        Arrays.sort(t, 0, k);
        Map<String, Integer> kinds = new HashMap<>(errorKinds);
        StringBuilder kb = new StringBuilder("{");
        boolean first = true;
        for (Map.Entry<String, Integer> e : kinds.entrySet()) {
            if (!first) kb.append(',');
            first = false;
            kb.append(str(e.getKey())).append(':').append(e.getValue());
        }
        kb.append('}');
        StringBuilder sb = new StringBuilder("[");
        synchronized (errorSamples) {
            for (int i = 0; i < errorSamples.size(); i++) {
                if (i > 0) sb.append(',');
                sb.append(str(errorSamples.get(i)));
            }
        }
        sb.append(']');
        Map<String, String> out = new LinkedHashMap<>();
        out.put("producers", String.valueOf(producers));
        out.put("partitions", String.valueOf(partitions));
        out.put("commits", String.valueOf(k));
        out.put("seconds", num(seconds));
        out.put("commits_per_s", num(k / seconds));
        out.put("commit_p50_ms", num(pct(c, k, 50)));
        out.put("commit_p99_ms", num(pct(c, k, 99)));
        out.put("txn_p50_ms", num(pct(t, k, 50)));
        out.put("txn_p99_ms", num(pct(t, k, 99)));
        out.put("errors", String.valueOf(errors.get()));
        out.put("init_s", num(initSeconds));
        out.put("stopped_producers", String.valueOf(stoppedThreads.get()));
        out.put("error_kinds", kb.toString());
        out.put("error_samples", sb.toString());
        out.put("timed_out", String.valueOf(timedOut));
        if (failure != null) out.put("failure", str(failure));
        StringBuilder j = new StringBuilder("{");
        first = true;
        for (Map.Entry<String, String> e : out.entrySet()) {
            if (!first) j.append(',');
            first = false;
            j.append(str(e.getKey())).append(':').append(e.getValue());
        }
        j.append('}');
        System.out.println(j);
        System.out.flush();
    }

    public static void main(String[] args) throws Exception {
        parse(args);
        long hardMs = (long) ((seconds + warmup + 120) * 1000);
        Thread watchdog = new Thread(() -> {
            try {
                Thread.sleep(hardMs);
            } catch (InterruptedException e) {
                return;
            }
            System.err.println("TxnFanout: hard deadline of " + hardMs / 1000 + " s reached; exiting");
            report(true, "hard deadline reached");
            Runtime.getRuntime().halt(3);
        }, "watchdog");
        watchdog.setDaemon(true);
        watchdog.start();

        try {
            ensureTopic();
        } catch (Throwable e) {
            System.err.println("TxnFanout: topic setup failed: " + e);
            report(false, "topic setup failed: " + e);
            System.exit(1);
        }

        long t0 = System.nanoTime();
        CountDownLatch ready = new CountDownLatch(producers), go = new CountDownLatch(1);
        workers = new Worker[producers];
        Thread[] threads = new Thread[producers];
        deadlineNs = Long.MAX_VALUE;
        measureStartNs = Long.MAX_VALUE;
        for (int i = 0; i < producers; i++) {
            workers[i] = new Worker(i, ready, go);
            threads[i] = new Thread(workers[i], "txn-" + i);
            threads[i].start();
        }
        // initTransactions is bounded by max.block.ms (60 s) per producer
        if (!ready.await(110, TimeUnit.SECONDS)) {
            System.err.println("TxnFanout: " + ready.getCount() + " producers not initialised after 110 s; starting without them");
        }
        initSeconds = (System.nanoTime() - t0) / 1e9;
        long start = System.nanoTime();
        measureStartNs = start + (long) (warmup * 1e9);
        deadlineNs = measureStartNs + (long) (seconds * 1e9);
        go.countDown();
        // Workers stop starting transactions at the deadline; a commit in flight
        // then takes at most request/delivery timeouts. Close is 5 s per producer,
        // in parallel. Wait a bounded time for all of them.
        long joinUntil = deadlineNs + TimeUnit.SECONDS.toNanos(100);
        for (Thread th : threads) {
            long left = joinUntil - System.nanoTime();
            if (left > 0) th.join(Math.max(1, left / 1_000_000));
        }
        int alive = 0;
        for (Thread th : threads) if (th.isAlive()) alive++;
        if (alive > 0) System.err.println("TxnFanout: " + alive + " producer threads still running at exit");
        report(false, null);
        System.exit(0);
    }
}
