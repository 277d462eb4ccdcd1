import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicBoolean;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.state.KeyValueStore;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * A Kafka Streams application with processing.guarantee=exactly_once_v2 for
 * tests/test_streams.py: it reads records keyed by account ("acct-17") whose
 * value is an integer amount, re-keys them by region (account number mod
 * REGIONS, so the groupBy goes through a repartition topic), sums the amounts
 * per region in a persistent state store (backed by a changelog topic) and
 * writes the running total per region ("region-3" -> "123456") to the output
 * topic. It runs until it is killed; it exits with status 2 if the Streams
 * client dies (ERROR or NOT_RUNNING without a shutdown request).
 *
 *   java -cp ... StreamsEosApp BOOTSTRAP APPLICATION_ID STATE_DIR INPUT OUTPUT [REGIONS]
 *
 * It logs with slf4j (slf4j-simple, to stderr) at INFO and above.
 *
 * The output keys start with "region-"; -DStreamsEosApp.keyPrefix=PREFIX
 * changes that (tests/test_streams_writers.py tells two apps' records apart).
 */
public final class StreamsEosApp {
    static final String REPARTITION_NAME = "by-region";
    static final String STORE_NAME = "region-sums";
    static final String KEY_PREFIX = System.getProperty("StreamsEosApp.keyPrefix", "region-");

    private StreamsEosApp() {}

    static void configureLogging() {
        setDefault("org.slf4j.simpleLogger.defaultLogLevel", "info");
        setDefault("org.slf4j.simpleLogger.showDateTime", "true");
        setDefault("org.slf4j.simpleLogger.dateTimeFormat", "HH:mm:ss.SSS");
        setDefault("org.slf4j.simpleLogger.logFile", "System.err");
        // The clients' full config dumps at every (re)start: keep them out.
        for (String cls : new String[] {
                "org.apache.kafka.clients.consumer.ConsumerConfig",
                "org.apache.kafka.clients.producer.ProducerConfig",
                "org.apache.kafka.clients.admin.AdminClientConfig",
                "org.apache.kafka.streams.StreamsConfig",
                "org.apache.kafka.common.utils.AppInfoParser"}) {
            setDefault("org.slf4j.simpleLogger.log." + cls, "warn");
        }
    }

    private static void setDefault(String key, String value) {
        if (System.getProperty(key) == null) {
            System.setProperty(key, value);
        }
    }

    static String region(String account, int regions) {
        int n = Integer.parseInt(account.substring(account.lastIndexOf('-') + 1));
        return KEY_PREFIX + Math.floorMod(n, regions);
    }

    public static void main(String[] args) throws InterruptedException {
        if (args.length < 5 || args.length > 6) {
            System.err.println("usage: StreamsEosApp BOOTSTRAP APPLICATION_ID STATE_DIR INPUT OUTPUT [REGIONS]");
            System.exit(64);
        }
        configureLogging();
        final Logger log = LoggerFactory.getLogger(StreamsEosApp.class);
        final String bootstrap = args[0];
        final String appId = args[1];
        final String stateDir = args[2];
        final String input = args[3];
        final String output = args[4];
        final int regions = args.length > 5 ? Integer.parseInt(args[5]) : 7;

        Properties props = new Properties();
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, appId);
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
        props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 200);
        props.put(StreamsConfig.STATE_DIR_CONFIG, stateDir);
        props.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, 1);
        props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, 1);
        props.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 64 * 1024L);
        props.put(StreamsConfig.REPARTITION_PURGE_INTERVAL_MS_CONFIG, 1000L);
        // A killed instance's member must leave the group quickly for the
        // restarted one to get its tasks (6 s is the broker's minimum).
        props.put(StreamsConfig.consumerPrefix(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG), 6000);
        props.put(StreamsConfig.consumerPrefix(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG), 1500);
        props.put(StreamsConfig.consumerPrefix(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG), "earliest");
        // An open transaction of a killed instance whose successor has another
        // transactional id (state dir deleted) is aborted by this timeout.
        props.put(StreamsConfig.producerPrefix(ProducerConfig.TRANSACTION_TIMEOUT_CONFIG), 10000);

        StreamsBuilder builder = new StreamsBuilder();
        builder.stream(input, Consumed.with(Serdes.String(), Serdes.String()))
            .mapValues(v -> Long.parseLong(v.trim()))
            .groupBy((account, amount) -> region(account, regions),
                     Grouped.with(REPARTITION_NAME, Serdes.String(), Serdes.Long()))
            .reduce(Long::sum,
                    Materialized.<String, Long, KeyValueStore<Bytes, byte[]>>as(STORE_NAME)
                        .withKeySerde(Serdes.String())
                        .withValueSerde(Serdes.Long()))
            .toStream()
            .mapValues(total -> Long.toString(total))
            .to(output, Produced.with(Serdes.String(), Serdes.String()));

        final KafkaStreams streams = new KafkaStreams(builder.build(props), props);
        final CountDownLatch dead = new CountDownLatch(1);
        final AtomicBoolean closing = new AtomicBoolean(false);
        streams.setStateListener((newState, oldState) -> {
            log.info("app state {} -> {}", oldState, newState);
            if (newState == KafkaStreams.State.ERROR
                || (newState == KafkaStreams.State.NOT_RUNNING && !closing.get())) {
                dead.countDown();
            }
        });
        streams.setUncaughtExceptionHandler(e -> {
            log.error("uncaught exception in a stream thread", e);
            return StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            closing.set(true);
            streams.close(java.time.Duration.ofSeconds(10));
        }, "shutdown"));
        log.info("starting: application.id={} state.dir={} input={} output={} regions={}",
                 appId, stateDir, input, output, regions);
        streams.start();
        dead.await();
        log.error("Kafka Streams client stopped: state {}", streams.state());
        streams.close(java.time.Duration.ofSeconds(10));
        System.exit(2);
    }
}
