"""Foreign Kafka programs (Spring Kafka, Kafka Streams, Kafka Connect, a share consumer,
a plain producer) that the tests run against the test broker: built from Maven Central
once (build.py), started and stopped by programs.py."""
