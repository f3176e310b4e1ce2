package dev.redrive.neighbours;

import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicBoolean;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.consumer.AcknowledgeType;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaShareConsumer;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicIdPartition;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

/**
 * A share group's consumer with explicit acknowledgement: it rejects a record whose value
 * starts with "fail" and accepts the others. Before it joins, it configures its group
 * (a GROUP config resource): read from the earliest offset, and the broker's dead-letter
 * topic for rejected records. Arguments: BOOTSTRAP TOPIC GROUP DLQ_TOPIC COPY_RECORD
 * (true: the dead letter carries the record's key and value, else only its context).
 */
public final class ShareConsumer {
    private ShareConsumer() {}

    public static void run(String[] args) throws Exception {
        String bootstrap = Main.need(args, 0, "bootstrap servers");
        String topic = Main.need(args, 1, "topic");
        String group = Main.need(args, 2, "group");
        String dlq = Main.need(args, 3, "DLQ topic");
        String copy = Main.need(args, 4, "copy record (true or false)");
        configureGroup(bootstrap, group, dlq, copy);

        Properties config = new Properties();
        config.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        config.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        config.put(ConsumerConfig.SHARE_ACKNOWLEDGEMENT_MODE_CONFIG, "explicit");
        config.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class);
        config.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class);
        AtomicBoolean running = new AtomicBoolean(true);
        CountDownLatch closed = new CountDownLatch(1);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            running.set(false);
            try {
                closed.await();
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }, "share-consumer-stop"));
        try (KafkaShareConsumer<byte[], byte[]> consumer = new KafkaShareConsumer<>(config)) {
            consumer.subscribe(List.of(topic));
            Events.emit("subscribed", "topic", topic, "group", group);
            while (running.get()) {
                for (ConsumerRecord<byte[], byte[]> record : consumer.poll(Duration.ofMillis(200))) {
                    AcknowledgeType type = Main.fails(record.value()) ? AcknowledgeType.REJECT : AcknowledgeType.ACCEPT;
                    Map<String, Object> event = Events.record("delivered", record);
                    event.put("delivery_count", record.deliveryCount().map(Number::intValue).orElse(null));
                    event.put("acknowledge", type.name());
                    Events.emit(event);
                    consumer.acknowledge(record, type);
                }
                for (Map.Entry<TopicIdPartition, Optional<KafkaException>> result : consumer.commitSync().entrySet()) {
                    Events.emit("committed", "partition", result.getKey().toString(),
                            "error", result.getValue().map(String::valueOf).orElse(null));
                }
            }
        } finally {
            closed.countDown();
        }
    }

    private static void configureGroup(String bootstrap, String group, String dlq, String copy) throws Exception {
        try (Admin admin = Admin.create(Map.of(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap))) {
            ConfigResource resource = new ConfigResource(ConfigResource.Type.GROUP, group);
            List<AlterConfigOp> settings = List.of(
                    set("share.auto.offset.reset", "earliest"),
                    set("errors.deadletterqueue.topic.name", dlq),
                    set("errors.deadletterqueue.copy.record.enable", copy));
            admin.incrementalAlterConfigs(Map.of(resource, settings)).all().get();
        }
        Events.emit("configured", "group", group, "dlq", dlq, "copy_record", Boolean.parseBoolean(copy));
    }

    private static AlterConfigOp set(String name, String value) {
        return new AlterConfigOp(new ConfigEntry(name, value), AlterConfigOp.OpType.SET);
    }
}
