package dev.redrive.neighbours;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import org.apache.kafka.connect.cli.ConnectStandalone;

/**
 * Kafka Connect standalone running a sink connector ({@link EventSinkConnector}) on
 * TOPIC, its values read by the JsonConverter without schemas: a value that is not JSON
 * fails conversion, and with errors.tolerance=all the runtime sends the record to its
 * dead-letter queue topic, with the context headers. Arguments: BOOTSTRAP TOPIC
 * DLQ_TOPIC WORK_DIR (where the worker's and the connector's properties are written).
 */
public final class ConnectSink {
    private ConnectSink() {}

    public static void run(String[] args) throws Exception {
        String bootstrap = Main.need(args, 0, "bootstrap servers");
        String topic = Main.need(args, 1, "topic");
        String dlq = Main.need(args, 2, "DLQ topic");
        Path work = Path.of(Main.need(args, 3, "work folder"));
        Files.createDirectories(work);
        Path worker = write(work.resolve("worker.properties"), List.of(
                "bootstrap.servers=" + bootstrap,
                "key.converter=org.apache.kafka.connect.storage.StringConverter",
                "value.converter=org.apache.kafka.connect.json.JsonConverter",
                "value.converter.schemas.enable=false",
                "offset.storage.file.filename=" + work.resolve("offsets"),
                "offset.flush.interval.ms=500",
                // Any free port: several tests (and test workers) may run a worker at once.
                "listeners=http://127.0.0.1:0",
                "plugin.discovery=only_scan"));
        Path connector = write(work.resolve("connector.properties"), List.of(
                "name=event-sink",
                "connector.class=" + EventSinkConnector.class.getName(),
                "tasks.max=1",
                "topics=" + topic,
                "errors.tolerance=all",
                "errors.log.enable=true",
                "errors.deadletterqueue.topic.name=" + dlq,
                "errors.deadletterqueue.topic.replication.factor=1",
                "errors.deadletterqueue.context.headers.enable=true"));
        ConnectStandalone.main(new String[] {worker.toString(), connector.toString()});
    }

    private static Path write(Path file, List<String> lines) throws IOException {
        return Files.write(file, lines, StandardCharsets.UTF_8);
    }
}
