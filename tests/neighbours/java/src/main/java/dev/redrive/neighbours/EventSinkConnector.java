package dev.redrive.neighbours;

import java.util.Collections;
import java.util.List;
import java.util.Map;
import org.apache.kafka.common.config.ConfigDef;
import org.apache.kafka.connect.connector.Task;
import org.apache.kafka.connect.sink.SinkConnector;

/**
 * A sink connector as a Connect user writes one: each record its task is given (once
 * the converters made it a value) becomes a "sunk" event. What a record that cannot be
 * converted becomes (the dead-letter queue, its headers) is the Connect runtime's doing.
 */
public class EventSinkConnector extends SinkConnector {
    private Map<String, String> settings = Map.of();

    @Override
    public String version() {
        return "1";
    }

    @Override
    public void start(Map<String, String> props) {
        settings = Map.copyOf(props);
    }

    @Override
    public Class<? extends Task> taskClass() {
        return EventSinkTask.class;
    }

    @Override
    public List<Map<String, String>> taskConfigs(int maxTasks) {
        return Collections.nCopies(Math.max(1, Math.min(maxTasks, 1)), settings);
    }

    @Override
    public void stop() {}

    @Override
    public ConfigDef config() {
        return new ConfigDef();
    }
}
