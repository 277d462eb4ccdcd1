import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.Future;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * Produces N records with the Java client (acks=all, idempotence off) to an
 * existing topic, then reads them back with assign()/seek() and checks key,
 * value, headers, timestamp and offsets. Prints one line starting with
 * "RESULT ok" or "RESULT FAIL" and exits 0 or 1.
 *
 * Usage: JavaClientCheck BOOTSTRAP TOPIC PARTITIONS N COMPRESSION
 */
public final class JavaClientCheck {
    private static final class Sent {
        final int partition;
        final byte[] key;
        final byte[] value;
        final long timestamp;
        final String header;
        long offset = -1;

        Sent(int partition, byte[] key, byte[] value, long timestamp, String header) {
            this.partition = partition;
            this.key = key;
            this.value = value;
            this.timestamp = timestamp;
            this.header = header;
        }
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 5) {
            System.err.println("usage: JavaClientCheck BOOTSTRAP TOPIC PARTITIONS N COMPRESSION");
            System.exit(2);
        }
        String bootstrap = args[0];
        String topic = args[1];
        int partitions = Integer.parseInt(args[2]);
        int n = Integer.parseInt(args[3]);
        String compression = args[4];
        long baseTs = System.currentTimeMillis() - 3_600_000L;

        Properties pp = new Properties();
        pp.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        pp.put(ProducerConfig.ACKS_CONFIG, "all");
        pp.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "false");
        pp.put(ProducerConfig.MAX_IN_FLIGHT_REQUESTS_PER_CONNECTION, "1");
        pp.put(ProducerConfig.COMPRESSION_TYPE_CONFIG, compression);
        pp.put(ProducerConfig.LINGER_MS_CONFIG, "5");
        pp.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, "60000");
        pp.put(ProducerConfig.REQUEST_TIMEOUT_MS_CONFIG, "30000");
        pp.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        pp.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());

        List<Sent> sent = new ArrayList<>(n);
        List<Future<RecordMetadata>> futures = new ArrayList<>(n);
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(pp)) {
            for (int i = 0; i < n; i++) {
                int partition = i % partitions;
                byte[] key = ("jkey-" + i).getBytes(StandardCharsets.UTF_8);
                StringBuilder v = new StringBuilder("java-value-").append(i).append(';');
                for (int r = 0; r < i % 40; r++) {
                    v.append("payload-").append(r);
                }
                byte[] value = v.toString().getBytes(StandardCharsets.UTF_8);
                long ts = baseTs + i;
                String header = "h-" + i;
                Sent s = new Sent(partition, key, value, ts, header);
                ProducerRecord<byte[], byte[]> rec =
                    new ProducerRecord<>(topic, partition, ts, key, value);
                rec.headers().add("seq", header.getBytes(StandardCharsets.UTF_8));
                sent.add(s);
                futures.add(producer.send(rec));
            }
            producer.flush();
            for (int i = 0; i < n; i++) {
                RecordMetadata md = futures.get(i).get();
                sent.get(i).offset = md.offset();
            }
        }

        // Offsets acknowledged per partition must be dense from 0 in send order.
        long[] next = new long[partitions];
        for (Sent s : sent) {
            if (s.offset != next[s.partition]) {
                fail("partition " + s.partition + ": acknowledged offset " + s.offset
                    + ", expected " + next[s.partition]);
            }
            next[s.partition]++;
        }

        Properties cp = new Properties();
        cp.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        cp.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        cp.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "none");
        cp.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        cp.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());

        List<List<ConsumerRecord<byte[], byte[]>>> got = new ArrayList<>();
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(cp)) {
            List<TopicPartition> tps = new ArrayList<>();
            for (int p = 0; p < partitions; p++) {
                tps.add(new TopicPartition(topic, p));
                got.add(new ArrayList<>());
            }
            consumer.assign(tps);
            for (TopicPartition tp : tps) {
                consumer.seek(tp, 0L);
            }
            long deadline = System.nanoTime() + Duration.ofSeconds(120).toNanos();
            int total = 0;
            while (total < n) {
                if (System.nanoTime() > deadline) {
                    fail("consumer timed out after " + total + " of " + n + " records");
                }
                ConsumerRecords<byte[], byte[]> recs = consumer.poll(Duration.ofMillis(500));
                for (ConsumerRecord<byte[], byte[]> r : recs) {
                    got.get(r.partition()).add(r);
                    total++;
                }
            }
            if (total != n) {
                fail("consumed " + total + " records, produced " + n);
            }
        }

        int[] idx = new int[partitions];
        for (Sent s : sent) {
            ConsumerRecord<byte[], byte[]> r = got.get(s.partition).get(idx[s.partition]++);
            String where = "partition " + s.partition + " offset " + s.offset;
            if (r.offset() != s.offset) {
                fail(where + ": read offset " + r.offset());
            }
            if (!Arrays.equals(r.key(), s.key) || !Arrays.equals(r.value(), s.value)) {
                fail(where + ": key/value differ");
            }
            if (r.timestamp() != s.timestamp) {
                fail(where + ": timestamp " + r.timestamp() + ", expected " + s.timestamp);
            }
            Header[] hs = r.headers().toArray();
            if (hs.length != 1 || !hs[0].key().equals("seq")
                    || !Arrays.equals(hs[0].value(), s.header.getBytes(StandardCharsets.UTF_8))) {
                fail(where + ": headers differ: " + Arrays.toString(hs));
            }
        }
        System.out.println("RESULT ok produced=" + n + " consumed=" + n + " compression=" + compression);
    }

    private static void fail(String why) {
        System.out.println("RESULT FAIL " + why);
        System.out.flush();
        System.exit(1);
    }
}
