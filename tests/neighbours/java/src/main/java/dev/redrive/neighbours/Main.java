package dev.redrive.neighbours;

import java.util.Arrays;

/** One jar, several programs: the first argument names the program, the rest are its own. */
public final class Main {
    private Main() {}

    public static void main(String[] args) throws Exception {
        Events.claimStdout();
        if (args.length == 0) {
            throw new IllegalArgumentException("usage: PROGRAM ARGS...");
        }
        String[] rest = Arrays.copyOfRange(args, 1, args.length);
        switch (args[0]) {
            case "spring-retryable-topic" -> SpringPrograms.retryableTopic(rest);
            case "spring-error-handler" -> SpringPrograms.errorHandler(rest);
            case "streams-dlq" -> StreamsDlq.run(rest);
            case "connect-sink" -> ConnectSink.run(rest);
            case "share-consumer" -> ShareConsumer.run(rest);
            case "keyed-producer" -> KeyedProducer.run(rest);
            default -> throw new IllegalArgumentException("no program " + args[0]);
        }
    }

    /** The rule every program's handler follows: a value starting with "fail" fails. */
    static boolean fails(byte[] value) {
        return value != null && Events.text(value).startsWith("fail");
    }

    static String need(String[] args, int index, String what) {
        if (index >= args.length) {
            throw new IllegalArgumentException("missing argument " + (index + 1) + ": " + what);
        }
        return args[index];
    }

    /** Keep the main thread (a JVM ends when it does) until the JVM is asked to stop. */
    static void parkUntilStopped() throws InterruptedException {
        Thread.currentThread().join();
    }
}
