package dev.redrive.neighbours;

import java.nio.ByteBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.util.Properties;
import org.apache.kafka.common.errors.SerializationException;
import org.apache.kafka.common.serialization.Deserializer;
import org.apache.kafka.common.serialization.Serde;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.errors.LogAndContinueExceptionHandler;
import org.apache.kafka.streams.errors.LogAndContinueProcessingExceptionHandler;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.processor.api.FixedKeyProcessor;
import org.apache.kafka.streams.processor.api.FixedKeyProcessorContext;
import org.apache.kafka.streams.processor.api.FixedKeyRecord;

/**
 * A Kafka Streams application with Streams' own dead-letter queue: it upper-cases the
 * values of INPUT into OUTPUT; a value starting with "fail" throws in the processor, a
 * value that is not UTF-8 fails to deserialize, and both handlers log, send the record
 * to the dead-letter queue topic and continue. Arguments: BOOTSTRAP INPUT OUTPUT
 * APPLICATION_ID DLQ_TOPIC STATE_DIR.
 */
public final class StreamsDlq {
    private StreamsDlq() {}

    public static void run(String[] args) throws InterruptedException {
        String input = Main.need(args, 1, "input topic");
        String output = Main.need(args, 2, "output topic");
        Properties config = new Properties();
        config.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, Main.need(args, 0, "bootstrap servers"));
        config.put(StreamsConfig.APPLICATION_ID_CONFIG, Main.need(args, 3, "application id"));
        config.put(StreamsConfig.ERRORS_DEAD_LETTER_QUEUE_TOPIC_NAME_CONFIG, Main.need(args, 4, "DLQ topic"));
        config.put(StreamsConfig.STATE_DIR_CONFIG, Main.need(args, 5, "state folder"));
        config.put(StreamsConfig.PROCESSING_EXCEPTION_HANDLER_CLASS_CONFIG,
                LogAndContinueProcessingExceptionHandler.class);
        config.put(StreamsConfig.DESERIALIZATION_EXCEPTION_HANDLER_CLASS_CONFIG,
                LogAndContinueExceptionHandler.class);
        config.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 200);

        StreamsBuilder builder = new StreamsBuilder();
        builder.stream(input, Consumed.with(Serdes.String(), strictUtf8()))
                .processValues(Upper::new)
                .to(output, Produced.with(Serdes.String(), Serdes.String()));
        KafkaStreams streams = new KafkaStreams(builder.build(), config);
        streams.setStateListener((now, before) -> Events.emit("state", "state", now.name()));
        streams.setUncaughtExceptionHandler(error -> {
            Events.emit("uncaught", "error", String.valueOf(error));
            return StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        Runtime.getRuntime().addShutdownHook(new Thread(streams::close, "streams-close"));
        streams.start();
        Main.parkUntilStopped();
    }

    /** Upper-cases a value, or throws for one that starts with "fail". */
    static final class Upper implements FixedKeyProcessor<String, String, String> {
        private FixedKeyProcessorContext<String, String> context;

        @Override
        public void init(FixedKeyProcessorContext<String, String> context) {
            this.context = context;
        }

        @Override
        public void process(FixedKeyRecord<String, String> record) {
            var metadata = context.recordMetadata().orElseThrow();
            Events.emit("processing", "topic", metadata.topic(), "partition", metadata.partition(),
                    "offset", metadata.offset(), "key", record.key(), "value", record.value());
            if (record.value() != null && record.value().startsWith("fail")) {
                throw new IllegalStateException("refused " + record.value());
            }
            context.forward(record.withValue(record.value() == null ? null : record.value().toUpperCase()));
        }
    }

    /** Strings that refuse bytes that are not UTF-8 (Serdes.String() would replace them). */
    static Serde<String> strictUtf8() {
        Deserializer<String> strict = (topic, data) -> {
            if (data == null) {
                return null;
            }
            try {
                return StandardCharsets.UTF_8.newDecoder()
                        .onMalformedInput(CodingErrorAction.REPORT)
                        .onUnmappableCharacter(CodingErrorAction.REPORT)
                        .decode(ByteBuffer.wrap(data))
                        .toString();
            } catch (CharacterCodingException e) {
                throw new SerializationException("not UTF-8: " + data.length + " bytes", e);
            }
        };
        return Serdes.serdeFrom(Serdes.String().serializer(), strict);
    }
}
