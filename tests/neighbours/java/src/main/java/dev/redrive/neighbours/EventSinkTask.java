package dev.redrive.neighbours;

import java.util.Collection;
import java.util.Map;
import org.apache.kafka.connect.sink.SinkRecord;
import org.apache.kafka.connect.sink.SinkTask;

/** The task of {@link EventSinkConnector}: a "sunk" event for each record it is given. */
public class EventSinkTask extends SinkTask {
    @Override
    public String version() {
        return "1";
    }

    @Override
    public void start(Map<String, String> props) {}

    @Override
    public void put(Collection<SinkRecord> records) {
        for (SinkRecord record : records) {
            Events.emit("sunk", "topic", record.originalTopic(), "partition", record.originalKafkaPartition(),
                    "offset", record.originalKafkaOffset(), "key", String.valueOf(record.key()),
                    "value", String.valueOf(record.value()));
        }
    }

    @Override
    public void stop() {}
}
