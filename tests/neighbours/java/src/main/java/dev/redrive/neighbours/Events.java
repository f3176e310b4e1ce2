package dev.redrive.neighbours;

import java.io.FileDescriptor;
import java.io.FileOutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Base64;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.Headers;

/**
 * The programs' events: one JSON object a line on standard output, which nothing else
 * may write to. {@link #claimStdout()} points System.out at standard error before any
 * library starts, so a library that prints (or a console log appender) ends up in the
 * harness's log file, never among the events.
 */
public final class Events {
    private static final PrintStream OUT =
            new PrintStream(new FileOutputStream(FileDescriptor.out), true, StandardCharsets.UTF_8);

    private Events() {}

    public static void claimStdout() {
        System.setOut(System.err);
    }

    /** An event with its fields, given as name, value, name, value... */
    public static void emit(String event, Object... fields) {
        Map<String, Object> object = new LinkedHashMap<>();
        object.put("event", event);
        for (int i = 0; i + 1 < fields.length; i += 2) {
            object.put((String) fields[i], fields[i + 1]);
        }
        emit(object);
    }

    public static void emit(Map<String, Object> object) {
        StringBuilder line = new StringBuilder();
        write(line, object);
        synchronized (OUT) {
            OUT.println(line);
        }
    }

    /** What a consumed record carried: where it was read, its key, value and headers. */
    public static Map<String, Object> record(String event, ConsumerRecord<byte[], byte[]> record) {
        Map<String, Object> object = new LinkedHashMap<>();
        object.put("event", event);
        object.put("topic", record.topic());
        object.put("partition", record.partition());
        object.put("offset", record.offset());
        object.put("timestamp", record.timestamp());
        object.put("key", text(record.key()));
        object.put("value", text(record.value()));
        object.put("headers", headers(record.headers()));
        return object;
    }

    /** Headers as [name, base64 value or null] pairs, in order, repeats kept. */
    public static List<Object> headers(Headers headers) {
        List<Object> pairs = new ArrayList<>();
        for (Header header : headers) {
            byte[] value = header.value();
            pairs.add(Arrays.asList(
                    header.key(), value == null ? null : Base64.getEncoder().encodeToString(value)));
        }
        return pairs;
    }

    public static String text(byte[] bytes) {
        return bytes == null ? null : new String(bytes, StandardCharsets.UTF_8);
    }

    private static void write(StringBuilder out, Object value) {
        if (value == null) {
            out.append("null");
        } else if (value instanceof Number || value instanceof Boolean) {
            out.append(value);
        } else if (value instanceof Map<?, ?> map) {
            out.append('{');
            boolean first = true;
            for (Map.Entry<?, ?> entry : map.entrySet()) {
                if (!first) {
                    out.append(',');
                }
                first = false;
                write(out, String.valueOf(entry.getKey()));
                out.append(':');
                write(out, entry.getValue());
            }
            out.append('}');
        } else if (value instanceof Iterable<?> items) {
            out.append('[');
            boolean first = true;
            for (Object item : items) {
                if (!first) {
                    out.append(',');
                }
                first = false;
                write(out, item);
            }
            out.append(']');
        } else {
            quote(out, value.toString());
        }
    }

    private static void quote(StringBuilder out, String text) {
        out.append('"');
        for (int i = 0; i < text.length(); i++) {
            char c = text.charAt(i);
            switch (c) {
                case '"' -> out.append("\\\"");
                case '\\' -> out.append("\\\\");
                case '\n' -> out.append("\\n");
                case '\r' -> out.append("\\r");
                case '\t' -> out.append("\\t");
                default -> {
                    if (c < 0x20) {
                        out.append(String.format("\\u%04x", (int) c));
                    } else {
                        out.append(c);
                    }
                }
            }
        }
        out.append('"');
    }
}
