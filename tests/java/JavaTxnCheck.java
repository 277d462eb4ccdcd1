import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.InvalidProducerEpochException;
import org.apache.kafka.common.errors.ProducerFencedException;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * Transactions with the Java client: commits and aborts across partitions,
 * then a zombie fenced by a second producer with the same transactional id.
 * Reads back read_committed and read_uncommitted and checks what each sees.
 * Prints "RESULT ok ..." or "RESULT FAIL ..." and exits 0 or 1.
 *
 * Usage: JavaTxnCheck BOOTSTRAP TOPIC PARTITIONS TXN_ID
 */
public final class JavaTxnCheck {
    private static Properties producerProps(String bootstrap, String txnId) {
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, txnId);
        p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        p.put(ProducerConfig.ACKS_CONFIG, "all");
        p.put(ProducerConfig.LINGER_MS_CONFIG, "2");
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        return p;
    }

    private static byte[] b(String s) {
        return s.getBytes(StandardCharsets.UTF_8);
    }

    private static List<String> readAll(String bootstrap, String topic, int partitions, String isolation) {
        Properties c = new Properties();
        c.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        c.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, isolation);
        c.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        c.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        c.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        List<String> out = new ArrayList<>();
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(c)) {
            List<TopicPartition> tps = new ArrayList<>();
            for (int i = 0; i < partitions; i++) {
                tps.add(new TopicPartition(topic, i));
            }
            consumer.assign(tps);
            consumer.seekToBeginning(tps);
            var end = consumer.endOffsets(tps);
            long deadline = System.currentTimeMillis() + 30_000;
            while (System.currentTimeMillis() < deadline) {
                for (ConsumerRecord<byte[], byte[]> r : consumer.poll(Duration.ofMillis(200))) {
                    out.add(new String(r.value(), StandardCharsets.UTF_8));
                }
                boolean done = true;
                for (TopicPartition tp : tps) {
                    if (consumer.position(tp) < end.get(tp)) {
                        done = false;
                    }
                }
                if (done) {
                    break;
                }
            }
        }
        out.sort(null);
        return out;
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 4) {
            System.err.println("usage: JavaTxnCheck BOOTSTRAP TOPIC PARTITIONS TXN_ID");
            System.exit(2);
        }
        String bootstrap = args[0];
        String topic = args[1];
        int partitions = Integer.parseInt(args[2]);
        String txnId = args[3];
        List<String> expectCommitted = new ArrayList<>();
        List<String> expectAll = new ArrayList<>();

        try (KafkaProducer<byte[], byte[]> p = new KafkaProducer<>(producerProps(bootstrap, txnId))) {
            p.initTransactions();
            for (int round = 0; round < 4; round++) {
                p.beginTransaction();
                for (int i = 0; i < 50; i++) {
                    String v = "round" + round + "-" + i;
                    p.send(new ProducerRecord<>(topic, i % partitions, b("k" + i), b(v)));
                    expectAll.add(v);
                    if (round % 2 == 0) {
                        expectCommitted.add(v);
                    }
                }
                if (round % 2 == 0) {
                    p.commitTransaction();
                } else {
                    p.flush();
                    p.abortTransaction();
                }
            }
        }

        // A zombie: begins, sends, is fenced by a new instance, then tries to commit.
        String zombieOutcome;
        KafkaProducer<byte[], byte[]> zombie = new KafkaProducer<>(producerProps(bootstrap, txnId));
        zombie.initTransactions();
        zombie.beginTransaction();
        zombie.send(new ProducerRecord<>(topic, 0, b("z"), b("zombie-1"))).get();
        expectAll.add("zombie-1");
        try (KafkaProducer<byte[], byte[]> fresh = new KafkaProducer<>(producerProps(bootstrap, txnId))) {
            fresh.initTransactions();
            fresh.beginTransaction();
            fresh.send(new ProducerRecord<>(topic, 0, b("f"), b("fresh-1")));
            fresh.commitTransaction();
            expectCommitted.add("fresh-1");
            expectAll.add("fresh-1");
            try {
                zombie.send(new ProducerRecord<>(topic, 0, b("z"), b("zombie-2"))).get();
                zombie.commitTransaction();
                zombieOutcome = "committed";
            } catch (ProducerFencedException | InvalidProducerEpochException e) {
                zombieOutcome = "fenced:" + e.getClass().getSimpleName();
            } catch (KafkaException e) {
                Throwable c = e.getCause() == null ? e : e.getCause();
                zombieOutcome = (c instanceof ProducerFencedException || c instanceof InvalidProducerEpochException)
                        ? "fenced:" + c.getClass().getSimpleName() : "other:" + e;
            } catch (java.util.concurrent.ExecutionException e) {
                Throwable c = e.getCause();
                zombieOutcome = (c instanceof ProducerFencedException || c instanceof InvalidProducerEpochException)
                        ? "fenced:" + c.getClass().getSimpleName() : "other:" + c;
            }
        } finally {
            zombie.close(Duration.ofSeconds(5));
        }

        expectCommitted.sort(null);
        expectAll.sort(null);
        List<String> committed = readAll(bootstrap, topic, partitions, "read_committed");
        List<String> all = readAll(bootstrap, topic, partitions, "read_uncommitted");
        List<String> problems = new ArrayList<>();
        if (!zombieOutcome.startsWith("fenced:")) {
            problems.add("zombie was not fenced: " + zombieOutcome);
        }
        if (!committed.equals(expectCommitted)) {
            problems.add("read_committed saw " + committed.size() + " records, expected " + expectCommitted.size());
        }
        if (!all.equals(expectAll)) {
            problems.add("read_uncommitted saw " + all.size() + " records, expected " + expectAll.size()
                    + (all.contains("zombie-2") ? " (zombie-2 got in!)" : ""));
        }
        if (problems.isEmpty()) {
            System.out.println("RESULT ok committed=" + committed.size() + " all=" + all.size() + " zombie=" + zombieOutcome);
            System.exit(0);
        }
        System.out.println("RESULT FAIL " + String.join("; ", problems));
        System.exit(1);
    }
}
