// The Flink job of tests/test_flink.py and the driver that runs it in a
// MiniCluster inside this JVM (one JobManager, one TaskManager).
//
// The job: KafkaSource (read_committed) on the orders topic -> a map that
// enriches each order -> KafkaSink with DeliveryGuarantee.EXACTLY_ONCE.
// Checkpoints are exactly-once, kept on disk when the JVM dies (a new JVM can
// restore from one), with the hashmap state backend.
//
// Arguments are key=value pairs:
//   bootstrap=HOST:PORT   input=TOPIC   output=TOPIC   prefix=TXN_ID_PREFIX
//   group=GROUP_ID        checkpoint-dir=DIR           interval-ms=N
//   txn-timeout-ms=N      parallelism=N                restore=PATH (optional)
//   restart-attempts=N    restart-delay-ms=N  (Flink's fixed-delay restarts)
//   restart-taskmanager=true|false  replace a TaskManager that died (default true)
//   producer.KEY=VALUE / consumer.KEY=VALUE   passed to the Kafka clients
//   flink.KEY=VALUE                           passed to Flink's configuration
//
// Protocol with the test (one line each, on stdout; Flink's own logging goes
// to stderr):
//   JOB <job id>            the job was submitted
//   STATUS <job status>     every change of the job's status
//   RESTORED <n>            the job (re)started from checkpoint or savepoint n
//   CHECKPOINT <n>          checkpoint n completed
//   SAVEPOINT <path>        a savepoint asked for on stdin is written
//   SAVEPOINT-FAILED <why>  it could not be taken
//   FAILED <why>            the job failed for good; the JVM exits with 2
//   TASKMANAGER-LOST        the TaskManager died of a fatal error
//   TASKMANAGER-STARTED     a new one replaced it
//   STOPPED                 the job ended on request; the JVM exits with 0
// Commands on stdin: `savepoint DIR`, `stop-with-savepoint DIR`, `quit`.
// End of input counts as `quit`.

import org.apache.flink.api.common.JobID;
import org.apache.flink.api.common.JobStatus;
import org.apache.flink.api.common.eventtime.WatermarkStrategy;
import org.apache.flink.api.common.functions.OpenContext;
import org.apache.flink.api.common.functions.RichMapFunction;
import org.apache.flink.api.common.state.CheckpointListener;
import org.apache.flink.api.common.typeinfo.TypeInformation;
import org.apache.flink.api.common.typeinfo.Types;
import org.apache.flink.api.java.tuple.Tuple2;
import org.apache.flink.configuration.CheckpointingOptions;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.configuration.CoreOptions;
import org.apache.flink.configuration.ExternalizedCheckpointRetention;
import org.apache.flink.configuration.JobManagerOptions;
import org.apache.flink.configuration.RestOptions;
import org.apache.flink.configuration.RestartStrategyOptions;
import org.apache.flink.configuration.StateBackendOptions;
import org.apache.flink.configuration.StateRecoveryOptions;
import org.apache.flink.configuration.TaskManagerOptions;
import org.apache.flink.connector.base.DeliveryGuarantee;
import org.apache.flink.connector.kafka.sink.KafkaRecordSerializationSchema;
import org.apache.flink.connector.kafka.sink.KafkaSink;
import org.apache.flink.connector.kafka.source.KafkaSource;
import org.apache.flink.connector.kafka.source.enumerator.initializer.OffsetsInitializer;
import org.apache.flink.connector.kafka.source.reader.deserializer.KafkaRecordDeserializationSchema;
import org.apache.flink.core.execution.CheckpointingMode;
import org.apache.flink.core.execution.JobClient;
import org.apache.flink.core.execution.SavepointFormatType;
import org.apache.flink.runtime.jobgraph.SavepointRestoreSettings;
import org.apache.flink.runtime.minicluster.MiniCluster;
import org.apache.flink.runtime.minicluster.MiniClusterConfiguration;
import org.apache.flink.runtime.minicluster.MiniClusterJobClient;
import org.apache.flink.runtime.minicluster.RpcServiceSharing;
import org.apache.flink.runtime.state.FunctionInitializationContext;
import org.apache.flink.runtime.state.FunctionSnapshotContext;
import org.apache.flink.streaming.api.checkpoint.CheckpointedFunction;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.streaming.api.graph.StreamGraph;
import org.apache.flink.util.Collector;

import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.OffsetResetStrategy;
import org.apache.kafka.clients.producer.ProducerRecord;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.Locale;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.TimeUnit;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

public final class OrdersEnrichJob {

    private OrdersEnrichJob() {}

    /** Protocol lines: whole lines, never interleaved, flushed at once. */
    static synchronized void say(String line) {
        System.out.println(line);
        System.out.flush();
    }

    static String oneLine(Throwable t) {
        StringBuilder sb = new StringBuilder();
        for (Throwable c = t; c != null; c = c.getCause()) {
            if (sb.length() > 0) {
                sb.append(" <- ");
            }
            sb.append(c.getClass().getName()).append(": ").append(c.getMessage());
            if (c.getCause() == c) {
                break;
            }
        }
        return sb.toString().replace('\n', ' ');
    }

    public static void main(String[] argv) throws Exception {
        Map<String, String> args = new HashMap<>();
        for (String a : argv) {
            int eq = a.indexOf('=');
            if (eq <= 0) {
                throw new IllegalArgumentException("expected key=value, got " + a);
            }
            args.put(a.substring(0, eq), a.substring(eq + 1));
        }
        String bootstrap = need(args, "bootstrap");
        String input = need(args, "input");
        String output = need(args, "output");
        String prefix = need(args, "prefix");
        String group = need(args, "group");
        String checkpointDir = need(args, "checkpoint-dir");
        long intervalMs = Long.parseLong(args.getOrDefault("interval-ms", "1000"));
        String txnTimeoutMs = args.getOrDefault("txn-timeout-ms", "60000");
        int parallelism = Integer.parseInt(args.getOrDefault("parallelism", "2"));
        String restore = args.getOrDefault("restore", "");

        Map<String, String> flink = new HashMap<>();
        flink.put(StateBackendOptions.STATE_BACKEND.key(), "hashmap");
        flink.put(CheckpointingOptions.CHECKPOINT_STORAGE.key(), "filesystem");
        flink.put(CheckpointingOptions.CHECKPOINTS_DIRECTORY.key(), toUri(checkpointDir));
        flink.put(CheckpointingOptions.CHECKPOINTING_INTERVAL.key(), intervalMs + " ms");
        flink.put(CheckpointingOptions.CHECKPOINTING_CONSISTENCY_MODE.key(),
                CheckpointingMode.EXACTLY_ONCE.name());
        flink.put(CheckpointingOptions.EXTERNALIZED_CHECKPOINT_RETENTION.key(),
                ExternalizedCheckpointRetention.RETAIN_ON_CANCELLATION.name());
        flink.put(CheckpointingOptions.MAX_RETAINED_CHECKPOINTS.key(), "3");
        flink.put(CheckpointingOptions.CHECKPOINTING_TIMEOUT.key(), "60 s");
        flink.put(RestartStrategyOptions.RESTART_STRATEGY.key(), "fixed-delay");
        flink.put(RestartStrategyOptions.RESTART_STRATEGY_FIXED_DELAY_ATTEMPTS.key(),
                args.getOrDefault("restart-attempts", "1000"));
        flink.put(RestartStrategyOptions.RESTART_STRATEGY_FIXED_DELAY_DELAY.key(),
                args.getOrDefault("restart-delay-ms", "1000") + " ms");
        flink.put(CoreOptions.DEFAULT_PARALLELISM.key(), Integer.toString(parallelism));
        flink.put(TaskManagerOptions.NUM_TASK_SLOTS.key(), Integer.toString(parallelism));
        // Everything the MiniCluster listens on stays on loopback.
        flink.put(RestOptions.ADDRESS.key(), "127.0.0.1");
        flink.put(RestOptions.BIND_ADDRESS.key(), "127.0.0.1");
        flink.put(RestOptions.BIND_PORT.key(), "0");
        flink.put(TaskManagerOptions.HOST.key(), "127.0.0.1");
        flink.put(TaskManagerOptions.BIND_HOST.key(), "127.0.0.1");
        flink.put(JobManagerOptions.BIND_HOST.key(), "127.0.0.1");
        flink.put(JobManagerOptions.ADDRESS.key(), "127.0.0.1");
        if (!restore.isEmpty()) {
            flink.put(StateRecoveryOptions.SAVEPOINT_PATH.key(), toUri(restore));
        }
        Properties producer = new Properties();
        producer.setProperty("transaction.timeout.ms", txnTimeoutMs);
        Properties consumer = new Properties();
        consumer.setProperty("isolation.level", "read_committed");
        for (Map.Entry<String, String> e : args.entrySet()) {
            String k = e.getKey();
            if (k.startsWith("flink.")) {
                flink.put(k.substring("flink.".length()), e.getValue());
            } else if (k.startsWith("producer.")) {
                producer.setProperty(k.substring("producer.".length()), e.getValue());
            } else if (k.startsWith("consumer.")) {
                consumer.setProperty(k.substring("consumer.".length()), e.getValue());
            }
        }

        Configuration conf = Configuration.fromMap(flink);
        StreamExecutionEnvironment env = StreamExecutionEnvironment.getExecutionEnvironment(conf);

        KafkaSource<Tuple2<String, String>> source =
                KafkaSource.<Tuple2<String, String>>builder()
                        .setBootstrapServers(bootstrap)
                        .setTopics(input)
                        .setGroupId(group)
                        .setStartingOffsets(committedOrEarliest())
                        .setDeserializer(new KeyValueDeserializer())
                        .setProperties(consumer)
                        .build();

        KafkaSink<Tuple2<String, String>> sink =
                KafkaSink.<Tuple2<String, String>>builder()
                        .setBootstrapServers(bootstrap)
                        .setDeliveryGuarantee(DeliveryGuarantee.EXACTLY_ONCE)
                        .setTransactionalIdPrefix(prefix)
                        .setKafkaProducerConfig(producer)
                        .setRecordSerializer(new KeyValueSerializer(output))
                        .build();

        env.fromSource(source, WatermarkStrategy.noWatermarks(), "orders")
                .uid("orders-source")
                .map(new Enrich())
                .uid("enrich")
                .returns(Types.TUPLE(Types.STRING, Types.STRING))
                .sinkTo(sink)
                .uid("orders-enriched-sink");

        // The MiniCluster is made here rather than by env.executeAsync() so
        // that a TaskManager that dies of a fatal error can be replaced, as a
        // supervisor restarts a TaskManager process in a real deployment.
        StreamGraph graph = env.getStreamGraph();
        graph.setJobName("orders-enrich");
        graph.setSavepointRestoreSettings(SavepointRestoreSettings.fromConfiguration(conf));
        graph.serializeUserDefinedInstances();
        MiniCluster cluster = new MiniCluster(new MiniClusterConfiguration.Builder()
                .setConfiguration(conf)
                .setNumTaskManagers(1)
                .setNumSlotsPerTaskManager(parallelism)
                .setRpcServiceSharing(RpcServiceSharing.SHARED)
                .build());
        cluster.start();
        JobID jobId = cluster.submitJob(graph).get(60, TimeUnit.SECONDS).getJobID();
        JobClient job = new MiniClusterJobClient(jobId, cluster, OrdersEnrichJob.class.getClassLoader(),
                MiniClusterJobClient.JobFinalizationBehavior.SHUTDOWN_CLUSTER);
        say("JOB " + jobId);
        Thread watcher = new Thread(() -> watch(job), "job-status-watcher");
        watcher.setDaemon(true);
        watcher.start();
        if (Boolean.parseBoolean(args.getOrDefault("restart-taskmanager", "true"))) {
            Thread supervisor = new Thread(() -> superviseTaskManager(cluster), "taskmanager-supervisor");
            supervisor.setDaemon(true);
            supervisor.start();
        }
        commands(job);
    }

    /**
     * A TaskManager that hits a fatal error (e.g. an exception thrown while a
     * failed task cleans up) is shut down for good by the MiniCluster; in a
     * real deployment its process exits and is restarted. Do the same: report
     * it, and start a new TaskManager a second later.
     */
    static void superviseTaskManager(MiniCluster cluster) {
        boolean seen = false;
        while (true) {
            sleep(200);
            int connected;
            try {
                connected = cluster.requestClusterOverview().get(10, TimeUnit.SECONDS)
                        .getNumTaskManagersConnected();
            } catch (Exception e) {
                continue;
            }
            if (connected > 0) {
                seen = true;
            } else if (seen) {
                say("TASKMANAGER-LOST");
                sleep(1000);
                try {
                    cluster.startTaskManager();
                    say("TASKMANAGER-STARTED");
                } catch (Exception e) {
                    say("FAILED could not start a new TaskManager: " + oneLine(e));
                    System.exit(2);
                }
                seen = false;
            }
        }
    }

    /** The group's committed offsets, else the earliest. The connector takes
     *  kafka-clients' OffsetResetStrategy, deprecated there since 4.0. */
    @SuppressWarnings("deprecation")
    static OffsetsInitializer committedOrEarliest() {
        return OffsetsInitializer.committedOffsets(OffsetResetStrategy.EARLIEST);
    }

    static String need(Map<String, String> args, String key) {
        String v = args.get(key);
        if (v == null || v.isEmpty()) {
            throw new IllegalArgumentException("missing argument " + key + "=...");
        }
        return v;
    }

    static String toUri(String path) {
        return path.contains(":/") ? path : "file://" + path;
    }

    /** Reports status changes; exits the JVM when the job is over. */
    static void watch(JobClient job) {
        JobStatus last = null;
        while (true) {
            JobStatus now;
            try {
                now = job.getJobStatus().get(30, TimeUnit.SECONDS);
            } catch (Exception e) {
                // The MiniCluster shuts down when the job is over.
                now = last;
                if (last == null || !last.isGloballyTerminalState()) {
                    try {
                        job.getJobExecutionResult().get(30, TimeUnit.SECONDS);
                        say("STOPPED");
                        System.exit(0);
                    } catch (Exception failure) {
                        say("FAILED " + oneLine(failure));
                        System.exit(2);
                    }
                }
            }
            if (now != last) {
                say("STATUS " + now);
                last = now;
            }
            if (now != null && now.isGloballyTerminalState()) {
                if (now == JobStatus.FAILED) {
                    String why;
                    try {
                        job.getJobExecutionResult().get(30, TimeUnit.SECONDS);
                        why = "(no cause reported)";
                    } catch (Exception e) {
                        why = oneLine(e);
                    }
                    say("FAILED " + why);
                    System.exit(2);
                }
                say("STOPPED");
                System.exit(0);
            }
            sleep(100);
        }
    }

    static void commands(JobClient job) throws Exception {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            line = line.trim();
            if (line.isEmpty()) {
                continue;
            }
            String[] words = line.split("\\s+", 2);
            String cmd = words[0].toLowerCase(Locale.ROOT);
            String arg = words.length > 1 ? words[1] : "";
            switch (cmd) {
                case "savepoint":
                    try {
                        String path = job.triggerSavepoint(toUri(arg), SavepointFormatType.CANONICAL)
                                .get(120, TimeUnit.SECONDS);
                        say("SAVEPOINT " + path);
                    } catch (Exception e) {
                        say("SAVEPOINT-FAILED " + oneLine(e));
                    }
                    break;
                case "stop-with-savepoint":
                    try {
                        String path = job.stopWithSavepoint(false, toUri(arg), SavepointFormatType.CANONICAL)
                                .get(120, TimeUnit.SECONDS);
                        say("SAVEPOINT " + path);
                        awaitEnd(job);
                        say("STOPPED");
                        System.exit(0);
                    } catch (Exception e) {
                        say("SAVEPOINT-FAILED " + oneLine(e));
                    }
                    break;
                case "quit":
                    quit(job);
                    return;
                default:
                    say("UNKNOWN-COMMAND " + line);
            }
        }
        quit(job);
    }

    static void quit(JobClient job) {
        try {
            job.cancel().get(30, TimeUnit.SECONDS);
            awaitEnd(job);
        } catch (Exception e) {
            // Already over, or the cluster is gone: nothing left to stop.
        }
        say("STOPPED");
        System.exit(0);
    }

    static void awaitEnd(JobClient job) {
        try {
            job.getJobExecutionResult().get(30, TimeUnit.SECONDS);
        } catch (Exception e) {
            // A cancelled job reports its cancellation as a failure here.
        }
    }

    static void sleep(long ms) {
        try {
            Thread.sleep(ms);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    /** (record key, record value) as UTF-8 strings. */
    static final class KeyValueDeserializer
            implements KafkaRecordDeserializationSchema<Tuple2<String, String>> {
        private static final long serialVersionUID = 1L;

        @Override
        public void deserialize(ConsumerRecord<byte[], byte[]> record, Collector<Tuple2<String, String>> out) {
            String key = record.key() == null ? "" : new String(record.key(), StandardCharsets.UTF_8);
            String value = record.value() == null ? "" : new String(record.value(), StandardCharsets.UTF_8);
            out.collect(Tuple2.of(key, value));
        }

        @Override
        public TypeInformation<Tuple2<String, String>> getProducedType() {
            return Types.TUPLE(Types.STRING, Types.STRING);
        }
    }

    /** Writes (key, value) to one topic, both as UTF-8. */
    static final class KeyValueSerializer
            implements KafkaRecordSerializationSchema<Tuple2<String, String>> {
        private static final long serialVersionUID = 1L;
        private final String topic;

        KeyValueSerializer(String topic) {
            this.topic = topic;
        }

        @Override
        public ProducerRecord<byte[], byte[]> serialize(
                Tuple2<String, String> kv, KafkaSinkContext context, Long timestamp) {
            return new ProducerRecord<>(topic, kv.f0.getBytes(StandardCharsets.UTF_8),
                    kv.f1.getBytes(StandardCharsets.UTF_8));
        }
    }

    /**
     * {"order_id": "o-000123", "amount": 1234} becomes
     * {"order_id":"o-000123","amount":1234,"amount_eur":"12.34","enriched":true}:
     * a pure function of the input, so two runs over the same orders write
     * byte-identical values. Subtask 0 reports completed checkpoints and
     * the checkpoint it restored from.
     */
    static final class Enrich extends RichMapFunction<Tuple2<String, String>, Tuple2<String, String>>
            implements CheckpointListener, CheckpointedFunction {
        private static final long serialVersionUID = 1L;
        private static final Pattern ORDER_ID = Pattern.compile("\"order_id\"\\s*:\\s*\"([^\"\\\\]*)\"");
        private static final Pattern AMOUNT = Pattern.compile("\"amount\"\\s*:\\s*(-?[0-9]+)");
        private transient boolean reporter;

        @Override
        public void open(OpenContext context) {
            reporter = getRuntimeContext().getTaskInfo().getIndexOfThisSubtask() == 0;
        }

        @Override
        public Tuple2<String, String> map(Tuple2<String, String> kv) {
            Matcher id = ORDER_ID.matcher(kv.f1);
            Matcher amount = AMOUNT.matcher(kv.f1);
            if (!id.find() || !amount.find()) {
                throw new IllegalArgumentException("not an order: key " + kv.f0 + ", value " + kv.f1);
            }
            long cents = Long.parseLong(amount.group(1));
            String eur = String.format(Locale.ROOT, "%s%d.%02d", cents < 0 ? "-" : "",
                    Math.abs(cents) / 100, Math.abs(cents) % 100);
            String value = "{\"order_id\":\"" + id.group(1) + "\",\"amount\":" + cents
                    + ",\"amount_eur\":\"" + eur + "\",\"enriched\":true}";
            return Tuple2.of(kv.f0, value);
        }

        @Override
        public void initializeState(FunctionInitializationContext context) {
            if (getRuntimeContext().getTaskInfo().getIndexOfThisSubtask() == 0) {
                context.getRestoredCheckpointId().ifPresent(n -> say("RESTORED " + n));
            }
        }

        @Override
        public void snapshotState(FunctionSnapshotContext context) {}

        @Override
        public void notifyCheckpointComplete(long checkpointId) {
            if (reporter) {
                say("CHECKPOINT " + checkpointId);
            }
        }
    }
}
