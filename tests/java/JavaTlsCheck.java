import java.io.FileInputStream;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Properties;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * The Java client over a secured listener, its security settings read from
 * a client properties file: a transactional producer commits ten records
 * and aborts five; a read_committed consumer in a group reads the ten and
 * commits its offset, which a second consumer of the group then sees.
 * With "expect-failure" it only tries to start the transactional producer
 * and reports how that failed.
 *
 * Prints "RESULT ok produced=10 consumed=10 committed=10", or
 * "RESULT failed CLASS: MESSAGE" (expect-failure), or "RESULT FAIL ...".
 *
 * Usage: JavaTlsCheck BOOTSTRAP TOPIC PROPERTIES_FILE TXN_ID [expect-failure]
 */
public final class JavaTlsCheck {
    private static Properties base(String bootstrap, String file) throws Exception {
        Properties p = new Properties();
        try (FileInputStream in = new FileInputStream(file)) {
            p.load(in);
        }
        p.put("bootstrap.servers", bootstrap);
        return p;
    }

    private static KafkaProducer<byte[], byte[]> producer(Properties base, String txnId) {
        Properties p = new Properties();
        p.putAll(base);
        p.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, txnId);
        p.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, "15000");
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        return new KafkaProducer<>(p);
    }

    private static KafkaConsumer<byte[], byte[]> consumer(Properties base, String group) {
        Properties c = new Properties();
        c.putAll(base);
        c.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        c.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
        c.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        c.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        c.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        c.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        return new KafkaConsumer<>(c);
    }

    public static void main(String[] args) throws Exception {
        String bootstrap = args[0];
        String topic = args[1];
        Properties base = base(bootstrap, args[2]);
        String txnId = args[3];
        boolean expectFailure = args.length > 4 && args[4].equals("expect-failure");
        if (expectFailure) {
            try (KafkaProducer<byte[], byte[]> p = producer(base, txnId)) {
                p.initTransactions();
                p.beginTransaction();
                p.send(new ProducerRecord<>(topic, 0, null, "x".getBytes(StandardCharsets.UTF_8))).get();
                p.commitTransaction();
                System.out.println("RESULT FAIL the producer was let in");
                System.exit(1);
            } catch (Exception e) {
                Throwable t = e;
                while (t.getCause() != null && t.getCause() != t) {
                    t = t.getCause();
                }
                System.out.println("RESULT failed " + e.getClass().getSimpleName() + ": " + e.getMessage()
                        + " (cause " + t.getClass().getSimpleName() + ": " + t.getMessage() + ")");
                System.exit(0);
            }
        }
        TopicPartition tp = new TopicPartition(topic, 0);
        try (KafkaProducer<byte[], byte[]> p = producer(base, txnId)) {
            p.initTransactions();
            p.beginTransaction();
            for (int i = 0; i < 10; i++) {
                p.send(new ProducerRecord<>(topic, 0, null, ("kept-" + i).getBytes(StandardCharsets.UTF_8)));
            }
            p.commitTransaction();
            p.beginTransaction();
            for (int i = 0; i < 5; i++) {
                p.send(new ProducerRecord<>(topic, 0, null, ("dropped-" + i).getBytes(StandardCharsets.UTF_8)));
            }
            p.flush();
            p.abortTransaction();
        }
        List<String> got = new ArrayList<>();
        String group = "java-tls-" + topic;
        try (KafkaConsumer<byte[], byte[]> c = consumer(base, group)) {
            c.subscribe(List.of(topic));
            long deadline = System.currentTimeMillis() + 60_000;
            while (got.size() < 10 && System.currentTimeMillis() < deadline) {
                for (ConsumerRecord<byte[], byte[]> r : c.poll(Duration.ofMillis(500))) {
                    got.add(new String(r.value(), StandardCharsets.UTF_8));
                }
            }
            c.commitSync();
        }
        for (int i = 0; i < got.size(); i++) {
            if (!got.get(i).equals("kept-" + i)) {
                System.out.println("RESULT FAIL read " + got);
                System.exit(1);
            }
        }
        long committed;
        try (KafkaConsumer<byte[], byte[]> c = consumer(base, group)) {
            Map<TopicPartition, OffsetAndMetadata> m = c.committed(java.util.Set.of(tp), Duration.ofSeconds(30));
            committed = m.get(tp) == null ? -1 : m.get(tp).offset();
        }
        // The aborted transaction's five records and two markers end the
        // partition at 17; the group committed where read_committed stopped.
        System.out.println("RESULT ok produced=10 consumed=" + got.size() + " committed=" + committed);
    }
}
