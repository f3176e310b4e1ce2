package dev.redrive.neighbours;

import java.util.Map;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.serialization.StringSerializer;

/**
 * A plain Java producer with the default partitioner: each KEY=VALUE argument after
 * BOOTSTRAP TOPIC becomes a keyed record, and a "produced" event says where it landed.
 * It exits once every record is acknowledged.
 */
public final class KeyedProducer {
    private KeyedProducer() {}

    public static void run(String[] args) throws Exception {
        String topic = Main.need(args, 1, "topic");
        Map<String, Object> config = Map.of(
                ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, Main.need(args, 0, "bootstrap servers"),
                ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class,
                ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class);
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(config)) {
            for (int i = 2; i < args.length; i++) {
                int split = args[i].indexOf('=');
                if (split < 0) {
                    throw new IllegalArgumentException("not KEY=VALUE: " + args[i]);
                }
                String key = args[i].substring(0, split);
                String value = args[i].substring(split + 1);
                RecordMetadata landed = producer.send(new ProducerRecord<>(topic, key, value)).get();
                Events.emit("produced", "key", key, "value", value, "topic", landed.topic(),
                        "partition", landed.partition(), "offset", landed.offset(),
                        "timestamp", landed.timestamp());
            }
        }
        Events.emit("done");
    }
}
