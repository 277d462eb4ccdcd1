import java.io.IOException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.Collections;
import java.util.HashSet;
import java.util.List;
import java.util.Locale;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.atomic.AtomicBoolean;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.CooperativeStickyAssignor;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.RangeAssignor;
import org.apache.kafka.clients.consumer.RoundRobinAssignor;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

/**
 * One consumer-group member (classic protocol) for tests/test_groups.py: the
 * Java counterpart of tests/group_member.py. Subscribes to one topic and
 * prints JSON lines on stdout for every rebalance callback and every change
 * of its assignment, with "t" from System.nanoTime() (CLOCK_MONOTONIC, the
 * clock of Python's time.monotonic()). Leaves the group cleanly when stdin
 * reaches EOF.
 *
 * Usage: JavaGroupMember BOOTSTRAP GROUP TOPIC STRATEGY NAME
 * (STRATEGY: range, roundrobin or cooperative-sticky)
 */
public final class JavaGroupMember {
    private static final Object OUT = new Object();
    private static String name;

    private static void emit(String event, Collection<TopicPartition> parts, String extra) {
        StringBuilder sb = new StringBuilder();
        sb.append("{\"t\": ").append(String.format(Locale.ROOT, "%.6f", System.nanoTime() / 1e9));
        sb.append(", \"name\": \"").append(name).append("\", \"event\": \"").append(event).append('"');
        if (parts != null) {
            List<Integer> ps = new ArrayList<>();
            for (TopicPartition tp : parts) {
                ps.add(tp.partition());
            }
            Collections.sort(ps);
            sb.append(", \"partitions\": ").append(ps);
        }
        if (extra != null) {
            sb.append(", ").append(extra);
        }
        sb.append('}');
        synchronized (OUT) {
            System.out.println(sb);
            System.out.flush();
        }
    }

    private static String quoted(String s) {
        return "\"" + s.replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", " ") + "\"";
    }

    public static void main(String[] args) {
        if (args.length != 5) {
            System.err.println("usage: JavaGroupMember BOOTSTRAP GROUP TOPIC STRATEGY NAME");
            System.exit(2);
        }
        String bootstrap = args[0];
        String group = args[1];
        String topic = args[2];
        String strategy = args[3];
        name = args[4];
        String assignor;
        switch (strategy) {
            case "range":
                assignor = RangeAssignor.class.getName();
                break;
            case "roundrobin":
                assignor = RoundRobinAssignor.class.getName();
                break;
            case "cooperative-sticky":
                assignor = CooperativeStickyAssignor.class.getName();
                break;
            default:
                System.err.println("unknown strategy " + strategy);
                System.exit(2);
                return;
        }

        Properties c = new Properties();
        c.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        c.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        c.put(ConsumerConfig.CLIENT_ID_CONFIG, name);
        c.put(ConsumerConfig.GROUP_PROTOCOL_CONFIG, "classic");
        c.put(ConsumerConfig.PARTITION_ASSIGNMENT_STRATEGY_CONFIG, assignor);
        c.put(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG, "6000");
        c.put(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG, "500");
        c.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        c.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        c.put(ConsumerConfig.FETCH_MAX_WAIT_MS_CONFIG, "100");
        c.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        c.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());

        AtomicBoolean stop = new AtomicBoolean(false);
        Thread stdin = new Thread(() -> {
            byte[] buf = new byte[4096];
            try {
                while (System.in.read(buf) >= 0) {
                    // keep reading until EOF
                }
            } catch (IOException e) {
                // treat like EOF
            }
            stop.set(true);
        });
        stdin.setDaemon(true);
        stdin.start();

        int rc = 0;
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(c)) {
            consumer.subscribe(List.of(topic), new ConsumerRebalanceListener() {
                @Override
                public void onPartitionsRevoked(Collection<TopicPartition> parts) {
                    emit("revoked", parts, null);
                }

                @Override
                public void onPartitionsAssigned(Collection<TopicPartition> parts) {
                    emit("assigned", parts, null);
                }

                @Override
                public void onPartitionsLost(Collection<TopicPartition> parts) {
                    emit("lost", parts, null);
                }
            });
            emit("ready", null, null);
            Set<TopicPartition> last = null;
            while (!stop.get()) {
                consumer.poll(Duration.ofMillis(100));
                Set<TopicPartition> now = consumer.assignment();
                if (!now.equals(last)) {
                    emit("owned", now, "\"member_id\": " + quoted(consumer.groupMetadata().memberId()));
                    last = new HashSet<>(now);
                }
            }
        } catch (RuntimeException e) {
            emit("error", null, "\"error\": " + quoted(e.toString()));
            rc = 1;
        }
        emit("closed", null, null);
        System.exit(rc);
    }
}
